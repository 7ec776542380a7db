"""The CNN harness's DiLoCo-family methods (examples/common/ashl_worker.py,
2026-12-07): the server each method's run starts accepts its policy with the
optimizer the harness passes, and the workers' rounds take the outer step
(not plain averaging); Streaming DiLoCo's run starts one 4-bit server per
fragment of the LeNet-5 and its worker's fragment commits cross the
emulated link 4-bit; a method the frozen tuning file has no entry for runs
the defaults instead of failing."""
import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
ashl = pytest.importorskip("ashl")
import ashl.torch as at  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(HERE, "..", "..", "examples", "cnn"))
sys.path.insert(2, os.path.join(HERE, "..", "..", "examples", "common"))

import ashl_worker  # noqa: E402
import harness  # noqa: E402
import protocol as P  # noqa: E402
import run as cnn_run  # noqa: E402
from torch_testing import flat, jobs  # noqa: E402

# The methods that run through DistributedOptimizer and serve(); Streaming
# DiLoCo runs StreamingDiLoCo and fragment servers (its own test below).
RUNNABLE_OUTER = [m for m in P.OUTER_METHODS if m not in P.NOT_WIRED and m not in P.STREAMING_METHODS]


def args_of(method, **config):
    """What policy_of reads of the harness's per-run arguments (the CNN's)."""
    cfg = dict(cnn_run.DEFAULT_CONFIG, **config)
    return types.SimpleNamespace(method=method, time_scale=5.0, config=cfg, switch_loss=0.5,
                                 W=types.SimpleNamespace(adsp_target_loss=0.4))


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Linear(6, 3)


def serve_as_the_harness(method, model, sjob, fabric):
    a = args_of(method)
    return at.serve(model, sjob, policy=ashl_worker.policy_of(a), compression="topk",
                    optimizer=ashl_worker.server_optimizer(method), fabric=fabric, background=True)


@pytest.mark.parametrize("method", RUNNABLE_OUTER)
def test_the_server_of_each_diloco_method_starts_with_the_harness_optimizer(method):
    # Before the fix the harness passed optimizer="model_delta", which the
    # server refuses beside a DiLoCo policy (server.optimizer ... pass "").
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = serve_as_the_harness(method, model, sjob, fabric)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model,
                                  policy=ashl_worker.policy_of(args_of(method)).name, compression="topk",
                                  job=wjob, fabric=fabric, overlap=False)
    assert opt.plan.stage in at._STAGES[P.NEEDS_POLICY[method]]
    opt.leave()
    srv.join()


@pytest.mark.parametrize("method", ["diloco", "async_local_sgd"])
def test_a_round_of_the_harness_diloco_methods_takes_the_outer_step_not_plain_averaging(method):
    # One worker, the harness's 8 local steps: plain averaging would leave the
    # server's model at the worker's local one; the outer Nesterov step
    # (lr 0.7, momentum 0.9) moves it to w0 + 0.7 * 1.9 * delta, past it.
    model = tiny_model()
    w0 = flat(model)
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = serve_as_the_harness(method, model, sjob, fabric)
    inner = RecordingSGD(model.parameters(), lr=0.05)
    opt = at.DistributedOptimizer(inner, model, policy=ashl_worker.policy_of(args_of(method)).name,
                                  compression="none", job=wjob, fabric=fabric, overlap=False)
    assert opt.plan.local_iterations == cnn_run.DEFAULT_CONFIG["local_steps"] == 8
    torch.manual_seed(1)
    for _ in range(8):
        x, y = torch.randn(8, 6), torch.randn(8, 3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    opt.wait()
    assert len(inner.after) == 8
    local = inner.after[-1]  # the model the round's delta came from
    got = flat(model)
    delta = local - w0
    assert torch.allclose(got, w0 + 0.7 * 1.9 * delta, atol=1e-5)
    assert not torch.allclose(got, local, atol=1e-4)
    opt.leave()
    srv.join()


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the parameters after each of its steps."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.after = []

    def step(self, closure=None):
        loss = super().step(closure)
        self.after.append(torch.cat([p.detach().reshape(-1) for g in self.param_groups for p in g["params"]]).clone())
        return loss


def test_a_method_missing_from_the_frozen_file_runs_the_defaults():
    frozen = {"chosen": {"ashl": {"config": {"lr": 0.07, "ratio": 0.1}}}}
    a = types.SimpleNamespace(W=types.SimpleNamespace(default_config=cnn_run.DEFAULT_CONFIG), overrides={})
    assert harness.config_for(a, "ashl", frozen)["lr"] == 0.07
    cfg = harness.config_for(a, "diloco", frozen)  # a KeyError before the fix
    assert cfg == cnn_run.DEFAULT_CONFIG
    assert (cfg["local_steps"], cfg["outer_lr"], cfg["outer_momentum"]) == (8, 0.7, 0.9)


@pytest.mark.parametrize("method", P.STREAMING_METHODS)
def test_the_harness_streaming_method_serves_each_fragment_with_the_four_bit_codec(method):
    # streaming_diloco_4bit's replies are dense f32; streaming_diloco_4bit_2way's 4-bit after the join's
    # (dense) pull, so each sync's reply crosses the link at about the commit's size.
    import cnn_common
    a = args_of(method)
    a.workers, a.rank, a.fabric = 1, 0, ashl.InprocFabric()
    model = cnn_common.make_model(1)  # the LeNet-5 of the run
    n = sum(p.numel() for p in model.parameters())
    servers = ashl_worker.fragment_servers(a, model, fabric=a.fabric)
    sizes = at.layer_fragment_sizes(model, 4)
    assert len(servers) == 4 and sum(sizes) == n == 61706
    w0 = flat(model)
    calls = []
    opt = ashl_worker.StreamingRun(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model,
                                   [[f"fragment{f}"] for f in range(4)], a,
                                   link=lambda d, b: calls.append((d, int(b))), batch_size=64)
    # The servers' settings reached the workers: block4 (B = 64) at 0.125 on every fragment.
    assert opt.codecs == ["block4:64"] * 4 and opt.plan.compression_ratio == pytest.approx(0.125)
    torch.manual_seed(2)
    for _ in range(16):  # H = 8, P = 4: fragment p syncs after step 8 + 2p, merges tau = 2 steps later
        x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.sd.finish()  # fragment 0's second sync (after step 16) is still on the wire
    assert opt.commits == 5
    ups = [b for d, b in calls if d == "up"]
    downs = [b for d, b in calls if d == "down"]
    assert len(ups) == len(downs) == 5
    # Fragments 0, 1, 2, 3, 0; exchanges overlap (fragment 2's tiny one may end before fragment 1's),
    # so the calls are matched by size, not by order.
    for size, up, down in zip(sorted(sizes + sizes[:1]), sorted(ups), sorted(downs)):
        packed = size // 2 + 4 * (-(-size // 64))  # 4.5 bits per element
        assert packed <= up < packed + 256, (size, up, down)
        if method == "streaming_diloco_4bit_2way":
            assert packed <= down < packed + 256, (size, up, down)
        else:
            assert down >= 4 * size, (size, up, down)
    got = torch.cat([torch.from_numpy(s.parameters()) for s in servers])
    assert torch.isfinite(got).all() and not torch.equal(got, w0)  # each fragment's outer step was taken
    opt.leave()
    for s in servers:
        s.join()
