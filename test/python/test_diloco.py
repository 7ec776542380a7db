"""The DiLoCo family through ashl.torch (docs/torch.md, "DiLoCo"): the
servers' outer step recomputed in numpy bit for bit, an AdamW inner
optimizer with the outer Nesterov step converging on a small regression,
the asynchronous form with Delayed Nesterov, and bad arguments named.
Servers are real ps::servers in this process (InprocFabric) or the UCX
loopback (127.0.0.1)."""
import numpy as np
import pytest
import torch

import ashl
import ashl.torch as at
from torch_testing import flat, in_threads, jobs


def tiny_model(seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


class RecordingSGD(torch.optim.SGD):
    """SGD that keeps a copy of the parameters after each of its steps: the
    last copy before a commit is the worker's w_i, its delta w_i - W."""

    def __init__(self, params, **kw):
        super().__init__(params, **kw)
        self.after = []

    @torch.no_grad()
    def step(self, closure=None):
        loss = super().step(closure)
        self.after.append(torch.cat([p.detach().reshape(-1) for g in self.param_groups for p in g["params"]]).clone())
        return loss


def test_outer_nesterov_step_matches_numpy_bit_for_bit():
    """policy="diloco", one worker, local_steps=2: each round the server
    takes g = (-1)*delta + 0*W (the mean of one delta), v = mu*v + g,
    W = W - lr*(g + mu*v), in float32 in that order (rules/optimizer.hpp)."""
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "diloco", "none", fabric=fabric, background=True, local_steps=2, outer_lr=0.7,
                   outer_momentum=0.9)
    inner = RecordingSGD(model.parameters(), lr=0.1)
    opt = at.DistributedOptimizer(model=model, inner=inner, policy="diloco", compression="none", local_steps=2,
                                  job=wjob, fabric=fabric)
    assert opt.plan.local_iterations == 2 and opt.plan.stage == "local_sgd"
    W = flat(model).numpy().astype(np.float32)
    v = np.zeros_like(W)
    lr, mu = np.float32(0.7), np.float32(0.9)
    torch.manual_seed(3)
    for _ in range(4):
        for _ in range(2):
            x, y = torch.randn(8, 6), torch.randn(8, 3)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.wait()
        local = inner.after[-1].numpy()
        delta = (local - W).astype(np.float32)            # the worker's update builder: params - w0
        acc = np.float32(0.0) + np.float32(1.0) * delta  # the round's weighted sum (mean of 1)
        g = np.float32(-1.0) * acc + np.float32(0.0) * W
        v = (mu * v + g).astype(np.float32)
        W = (W - lr * (g + mu * v)).astype(np.float32)
        got = flat(model).numpy()
        assert got.tobytes() == W.tobytes()
        assert not np.array_equal(got, local)  # the outer step is not plain averaging
    opt.leave()
    srv.join()


def _regression(seed):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(6, 3, generator=g)
    x = torch.randn(256, 6, generator=g)
    return x, x @ w_true


def _train(policy, workers, rounds, local_steps, inner_lr=0.05, compression="none", compression_ratio=1.0,
           codecs=None, reply_compression=None, telemetry=None, **outer):
    """`workers` workers in threads, AdamW inner, against in-process servers
    running `policy`; returns the initial loss on the whole set and each
    worker's at the end (its model holds the servers' parameters it pulled
    last)."""
    x, y = _regression(5)
    fabric = ashl.InprocFabric(deterministic=True)
    sjob, wjobs = jobs(workers)
    model0 = torch.nn.Linear(6, 3)
    torch.nn.init.zeros_(model0.weight)
    torch.nn.init.zeros_(model0.bias)
    initial = torch.nn.functional.mse_loss(model0(x), y).item()
    srv = at.serve(model0, sjob, policy, compression, compression_ratio=compression_ratio, fabric=fabric,
                   background=True, local_steps=local_steps, reply_compression=reply_compression, **outer)
    losses = {}

    def worker(r):
        model = torch.nn.Linear(6, 3)
        with torch.no_grad():
            model.weight.zero_()
            model.bias.zero_()
        opt = at.DistributedOptimizer(model=model, inner=torch.optim.AdamW(model.parameters(), lr=inner_lr,
                                                                           weight_decay=0.0),
                                      policy=policy, compression=compression, local_steps=local_steps, job=wjobs[r],
                                      fabric=fabric, **outer)
        g = torch.Generator().manual_seed(100 + r)
        for _ in range(rounds * local_steps):
            i = torch.randint(0, x.shape[0], (32,), generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x[i]), y[i]).backward()
            opt.step()
        opt.wait()
        with torch.no_grad():
            losses[r] = torch.nn.functional.mse_loss(model(x), y).item()
        if codecs is not None:
            codecs[r] = [(ex.worker.codec, ex.worker.plan["compression_ratio"]) for ex in opt._ex]
        if telemetry is not None:
            telemetry[r] = opt.telemetry
        opt.leave()

    errors = in_threads(workers, worker, 120)
    srv.join()
    assert not errors, errors
    if telemetry is not None:
        telemetry["server"] = srv.telemetry
    return initial, losses


def test_diloco_with_adamw_inner_converges():
    initial, losses = _train("diloco", 2, rounds=30, local_steps=10, outer_lr=0.7, outer_momentum=0.9)
    assert losses[0] == losses[1]  # both pulled the last round's parameters
    assert losses[0] < 0.02 * initial, (initial, losses)


def test_async_diloco_with_delayed_nesterov_converges():
    initial, losses = _train("async_diloco", 2, rounds=40, local_steps=10, inner_lr=0.01, outer_lr=0.7,
                             outer_momentum=0.9, outer_delay=2)
    assert all(l < 0.1 * initial for l in losses.values()), (initial, losses)


def test_diloco_with_four_bit_pseudo_gradients_converges():
    """compression="block4", compression_ratio=0.125: DiLoCo's plans keep
    everything, and the servers' ratio makes every commit a 4-bit block-
    quantized pseudo-gradient (with error feedback); it still converges."""
    codecs = {}
    initial, losses = _train("diloco", 2, rounds=30, local_steps=10, outer_lr=0.7, outer_momentum=0.9,
                             compression="block4", compression_ratio=0.125, codecs=codecs)
    for r in range(2):
        assert codecs[r] and all(c == ("block4:64", pytest.approx(0.125)) for c in codecs[r]), codecs
    assert losses[0] < 0.05 * initial, (initial, losses)
    with pytest.raises(ValueError, match=r"server.compression_ratio = 0.5: must be 1 with compression identity"):
        at.serve(tiny_model(), jobs()[0], "diloco", "none", compression_ratio=0.5, fabric=ashl.InprocFabric(),
                 background=True)


def test_diloco_four_bit_both_ways_converges():
    """reply_compression="block4": after each worker's first (dense) reply,
    every pull reply carries 4-bit codes of what the worker's copy lacks;
    with 4-bit commits too, DiLoCo still converges, and both workers end
    with the same parameters (the same view of the same versions)."""
    tel = {}
    initial, losses = _train("diloco", 2, rounds=30, local_steps=10, outer_lr=0.7, outer_momentum=0.9,
                             compression="block4", compression_ratio=0.125, reply_compression="block4",
                             telemetry=tel)
    assert losses[0] < 0.05 * initial, (initial, losses)
    assert losses[0] == losses[1]
    for r in range(2):
        assert tel[r]["compressed_replies"] == 30, tel[r]  # every round's reply; the join's was dense
    assert tel["server"]["compressed_replies"] == 60, tel["server"]
    with pytest.raises(ValueError, match=r"server.reply_compression.bits = 3: must be 2, 4 or 8"):
        at.serve(tiny_model(), jobs()[0], "diloco", "none", reply_compression="block3", fabric=ashl.InprocFabric(),
                 background=True)


def test_bad_outer_arguments_are_named():
    model = tiny_model()
    sjob, (wjob,) = jobs()
    fabric = ashl.InprocFabric()
    with pytest.raises(ValueError, match=r"diloco.outer_lr = 0: must be finite and > 0"):
        at.serve(model, sjob, "diloco", "none", fabric=fabric, background=True, outer_lr=0.0)
    with pytest.raises(ValueError, match=r"diloco.outer_momentum = 1: must be in \[0, 1\)"):
        at.serve(model, sjob, "diloco", "none", fabric=fabric, background=True, outer_momentum=1.0)
    with pytest.raises(ValueError, match=r"async_diloco.outer_delay = -1: must be >= 0"):
        at.serve(model, sjob, "async_diloco", "none", fabric=fabric, background=True, outer_delay=-1)
    with pytest.raises(ValueError, match=r"outer_lr = 0.7: the outer optimizer runs with a DiLoCo policy"):
        at.serve(model, sjob, "ssp", "none", fabric=fabric, background=True, outer_lr=0.7)
    with pytest.raises(ValueError, match=r"server.optimizer = \"sgd\": policy diloco runs its outer optimizer"):
        at.serve(model, sjob, "diloco", "none", optimizer="sgd", fabric=fabric, background=True)
    with pytest.raises(ValueError, match=r"optimizer.nesterov_delay = 0: must be >= 1"):
        at.serve(model, sjob, "adsp", "none", optimizer="outer", outer_delay=0, fabric=fabric, background=True)
    with pytest.raises(ValueError, match=r"local_steps = 0: must be an int >= 1"):
        at.DistributedOptimizer(model=model, inner=torch.optim.AdamW(model.parameters()), policy="diloco",
                                local_steps=0, job=wjob, fabric=fabric)
    with pytest.raises(ValueError, match=r"inner: the inner optimizer is given twice"):
        at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model,
                                inner=torch.optim.AdamW(model.parameters()), job=wjob, fabric=fabric)
    with pytest.raises(ValueError, match=r"inner: pass the inner optimizer"):
        at.DistributedOptimizer(model=model, policy="diloco", job=wjob, fabric=fabric)
    with pytest.raises(ValueError, match=r"update = 'gradient': policy 'diloco' commits model deltas"):
        at.DistributedOptimizer(model=model, inner=torch.optim.SGD(model.parameters(), lr=0.1), policy="diloco",
                                update="gradient", job=wjob, fabric=fabric)


def test_a_worker_told_other_local_steps_than_its_servers_plan_fails():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "diloco", "none", fabric=fabric, background=True, local_steps=4)
    with pytest.raises(ValueError, match=r"local_steps = 5: the servers plan 4 local steps"):
        at.DistributedOptimizer(model=model, inner=torch.optim.AdamW(model.parameters()), policy="diloco",
                                local_steps=5, job=wjob, fabric=fabric)
    srv.stop()
    srv.join()
