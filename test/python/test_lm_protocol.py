"""The language-model comparison's bytes (examples/lm, docs/lm.md): what the
harness's link model (examples/common/link.py) charges a worker per
exchange of each method, on the real model of the run (lm_common.GPT at
the harness's configuration), against that method's own reference worked
out here from first principles; and the method lists of the protocol
(protocol.py), the LM workload (run.py) and its grid (grid.json) agreeing.

Where the harness has a pure function for a method's bytes (DDP's ring,
protocol.ddp_bytes_per_step), it is checked against the reference; the
ashl-served methods' bytes are only counted at run time (ps::worker encodes
each commit and reply and calls the link hook with their size), so those
tests drive the harness's own worker pieces (ashl_worker.policy_of,
server_optimizer, fragment_servers, StreamingRun) in one process over an
InprocFabric and record what the hook is charged. Headers (the message's
and the codec's) are allowed a few hundred bytes per message; everything
else must be the reference's."""
import importlib.util
import json
import math
import os
import sys
import types

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples")
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.join(EXAMPLES, "lm"))
sys.path.insert(2, os.path.join(EXAMPLES, "common"))

import link as lk  # noqa: E402
import protocol as P  # noqa: E402

WORKERS = 9  # the reference job's (docs/lm.md): the ring DDP's bytes are costed as
HEADER_SLACK = 256  # bytes a message's header (ps::worker's and the codec's) may add to its payload


def _lm_run():
    """examples/lm/run.py under a name of its own: the CNN's run.py may
    already be imported as `run` (test_cnn_diloco.py)."""
    name = "ashl_examples_lm_run"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(EXAMPLES, "lm", "run.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def reference_parameters(d, layers, context, vocab):
    """The GPT's parameter count from its architecture (docs/lm.md, "Model"):
    token and position embeddings, per block two LayerNorms, the fused
    q/k/v projection, the output projection and the 4 d MLP (weights and
    biases), a final LayerNorm; the output layer is tied to the token
    embedding (no parameters of its own)."""
    block = 2 * (2 * d) + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return vocab * d + context * d + layers * block + 2 * d


@pytest.fixture(scope="module")
def lm():
    pytest.importorskip("torch")
    import lm_common as L
    model = L.make_model(1)
    n = sum(p.numel() for p in model.parameters())
    return types.SimpleNamespace(L=L, n=n, fp32=4 * n)


def test_the_model_the_bytes_are_counted_on_has_the_architectures_parameter_count(lm):
    L = lm.L
    want = reference_parameters(L.D_MODEL, L.LAYERS, L.CONTEXT, L.VOCAB)
    assert lm.n == want == 437_760  # docs/lm.md's figure
    assert L.model_bytes(L.make_model(2)) == 4 * want  # f32: what every dense exchange sends


# ------------------------------------------------------------------ DDP

def test_ddp_charges_the_ring_all_reduce_of_the_fp32_model_per_step(lm):
    ring = 2 * (WORKERS - 1) / WORKERS * lm.fp32  # a ring all-reduce: 2 (M - 1) / M of the tensor, each way
    assert lk.ring_bytes(lm.fp32, WORKERS) == pytest.approx(ring, rel=1e-12)
    assert P.ddp_bytes_per_step("ddp", lm.fp32, WORKERS) == pytest.approx(ring, rel=1e-12)
    # Post-local SGD: no gradient all-reduce after the switch, the model's every H steps.
    assert P.ddp_bytes_per_step("ddp_localsgd", lm.fp32, WORKERS) == 0.0
    assert P.ddp_bytes_per_step("ddp_localsgd", lm.fp32, WORKERS, averaging=True) == pytest.approx(ring, rel=1e-12)
    assert lk.ring_bytes(lm.fp32, 1) == 0.0  # one rank sends nothing


@pytest.fixture(scope="module")
def gloo_one_rank():
    """A one-process gloo group; the costed all-reduce is told the ring has nine ranks."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield torch, dist
    dist.destroy_process_group()


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def now(self):
        return self.t

    def sleep(self, d):
        self.t += d


@pytest.mark.parametrize("method", ["ddp", "ddp_localsgd"])
def test_each_ddp_method_puts_its_reference_bytes_on_the_link(gloo_one_rank, lm, method):
    # ddp_worker.py's hooks and classes on the language model (two DDP buckets), every
    # dist.all_reduce costed by link.costed_all_reduce as a ring of nine.
    torch, dist = gloo_one_rank
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    import numpy as np
    L = lm.L
    torch.set_num_threads(1)
    c = FakeClock()
    link = lk.Link(8.14e6, clock=c.now, sleep=c.sleep)
    original = lk.costed_all_reduce(link, dist, size_of=lambda group: WORKERS)
    start, period, steps = 2, 2, 6  # post-local SGD: all-reduce the gradients for `start` steps, then average every H
    try:
        model = L.make_model(1)
        ddp = DDP(model)  # the model has no buffers: ddp_worker.py's broadcast_buffers=False changes nothing here
        cfg = {"lr": 0.003}
        opt = sgd = L.inner_optimizer(ddp.parameters(), cfg, None)
        if method == "ddp":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        else:
            ddp.register_comm_hook(post_localSGD_hook.PostLocalSGDState(None, None, start, False),
                                   post_localSGD_hook.post_localSGD_hook)
            opt = PostLocalSGDOptimizer(sgd, averagers.PeriodicModelAverager(period=period, warmup_steps=start))

        class D:
            train = (np.arange(20_000) % 251).astype(np.uint8)

        for s in range(steps):
            opt.zero_grad()
            L.loss(ddp, L.train_batch(D, 1, 0, s, L.BATCH)).backward()
            opt.step()
    finally:
        dist.all_reduce = original
    ring = 2 * (WORKERS - 1) / WORKERS * 4 * reference_parameters(L.D_MODEL, L.LAYERS, L.CONTEXT, L.VOCAB)
    if method == "ddp":
        want = steps * ring  # every step all-reduces every gradient, fp32
    else:
        # Steps 1..start all-reduce the gradients; after the switch the model is averaged at every H-th
        # step counted from the switch (steps start + 1, start + 1 + H, ...), nothing in between.
        averaged = [k for k in range(start + 1, steps + 1) if (k - start - 1) % period == 0]
        assert averaged == [3, 5]
        want = (start + len(averaged)) * ring
    st = link.stats()
    # DDP's buckets sum to the model (each a float's rounding of the ring's 16/9 at most).
    assert st["bytes_up"] == pytest.approx(want, abs=4 * steps) and st["bytes_down"] == st["bytes_up"]


# ------------------------------------------------------------------ the ashl-served methods

def lm_args(method, **config):
    """The per-run arguments ashl_worker's pieces read, the LM workload's (run.py)."""
    run = _lm_run()
    cfg = dict(run.DEFAULT_CONFIG, **config)
    W = run.WORKLOAD
    return types.SimpleNamespace(method=method, time_scale=5.0, config=cfg, switch_loss=W.switch_loss, workers=1,
                                 rank=0, W=types.SimpleNamespace(adsp_target_loss=W.adsp_target_loss))


def _data():
    import numpy as np

    class D:
        train = (np.arange(20_000) % 251).astype(np.uint8)
    return D


def one_worker_run(method, steps, time_scale=5.0, **config):
    """One worker of `method` as ashl_worker.worker builds it (serve() with the
    method's policy and optimizer, DistributedOptimizer with top-k and the
    link hook, overlap off), over an InprocFabric; `steps` local iterations
    of the language model. Returns ([(direction, bytes)], the plan, the
    bucket sizes in elements)."""
    torch = pytest.importorskip("torch")
    ashl = pytest.importorskip("ashl")
    import ashl.torch as at
    import ashl_worker
    from torch_testing import jobs
    import lm_common as L
    torch.set_num_threads(1)
    a = lm_args(method, **config)
    a.time_scale = time_scale
    model = L.make_model(1)
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, policy=ashl_worker.policy_of(a), compression="topk",
                   optimizer=ashl_worker.server_optimizer(method), fabric=fabric, background=True)
    calls = []
    opt = at.DistributedOptimizer(L.inner_optimizer(model.parameters(), a.config, a), model,
                                  policy=ashl_worker.policy_of(a).name, compression="topk", job=wjob, fabric=fabric,
                                  batch_size=L.BATCH, seed=1, error_feedback=method == "ashl_plus",
                                  link=lambda d, b: calls.append((d, int(b))), overlap=False)
    try:
        D = _data()
        plans = []
        for s in range(steps):
            opt.zero_grad()
            L.loss(model, L.train_batch(D, 1, 0, s, L.BATCH)).backward()
            opt.step()
            plans.append((opt.plan.stage, opt.plan.local_iterations, opt.plan.compression_ratio))
        buckets = [sum(piece[3] for piece in b) for b in at.bucket_plan(model)]
    finally:
        opt.leave()
        srv.join()
    return calls, plans, buckets


def exchanges(calls, buckets):
    """The calls grouped into exchanges: each exchange one up and one down per
    bucket (in any order); returns [(up bytes per bucket, down bytes per bucket)]."""
    out, cur = [], []
    for c in calls:
        cur.append(c)
        if len(cur) == 2 * len(buckets):
            ups = [b for d, b in cur if d == "up"]
            downs = [b for d, b in cur if d == "down"]
            assert len(ups) == len(downs) == len(buckets), cur
            out.append((ups, downs))
            cur = []
    assert not cur, f"an exchange left half done: {cur}"
    return out


def within_header(got, payloads):
    """Each message's bytes are its reference payload plus a header at most
    HEADER_SLACK bytes (matched by size: buckets may come in either order)."""
    assert len(got) == len(payloads)
    for g, p in zip(sorted(got), sorted(payloads)):
        assert p <= g < p + HEADER_SLACK, (sorted(got), sorted(payloads))


@pytest.mark.parametrize("method", ["diloco", "async_local_sgd"])
def test_diloco_and_async_local_sgd_send_the_fp32_delta_every_local_steps_and_get_the_model_back(lm, method):
    # DiLoCo: every H = local_steps inner steps the worker sends its fp32 model delta (the
    # pseudo-gradient) and gets the model back; Async Local-SGD the same per worker, unsynchronised.
    H, rounds = 3, 2
    calls, plans, buckets = one_worker_run(method, H * rounds, local_steps=H)
    assert sum(buckets) == lm.n
    assert all(p[1] == H for p in plans)  # the configuration's local steps reached the plan
    ex = exchanges(calls, buckets)
    assert len(ex) == rounds  # one exchange per H steps, none in between
    for ups, downs in ex:
        within_header(ups, [4 * b for b in buckets])  # the fp32 delta, dense (not top-k pairs at ratio 1)
        within_header(downs, [4 * b for b in buckets])  # the fp32 model back
        assert sum(ups) < lm.fp32 + HEADER_SLACK * len(buckets)


def topk_reference(n, ratio):
    """Top-k of n f32 values at ratio r: about r n kept, each a u32 index and an f32 value, plus u64 n and
    u32 count (docs/codecs.md, topk: 12 + count (4 + 4)); (least, most) for count = floor, ceil of r n."""
    return 12 + 8 * math.floor(ratio * n), 12 + 8 * math.ceil(ratio * n)


@pytest.mark.parametrize("method,ratio", [("ashl", 0.3), ("ashl_plus", 0.1), ("ashl_outer", 0.3),
                                          ("ashl_diloco_sw", 0.1)])
def test_ashl_commits_top_k_at_its_ratio_once_planned_and_gets_the_model_back(lm, monkeypatch, method, ratio):
    # ASHL, ASHL+ and ashl's composition with the outer optimizer (ashl_outer, ashl_diloco_sw: the same
    # planner, the pseudo-gradient for the delta): profiling iterations (each a dense commit), then AHL,
    # a commit every H_i local iterations, each top-k at r0 (a u32 index and an f32 value per kept
    # element); the reply is the fp32 model.
    # The harness's plan (protocol.ASHL_PLAN: 5 profiling iterations, H_i = 8) is shortened to 2 and 1
    # so that the test runs in seconds: a commit's bytes depend on r0 and the buckets, not on H_i.
    monkeypatch.setitem(P.ASHL_PLAN, "profile_iterations", 2)
    monkeypatch.setitem(P.ASHL_PLAN, "profile_trim", 0)
    monkeypatch.setitem(P.ASHL_PLAN, "h_ahl", 1)
    profile, ahl_steps = 2, 3
    calls, plans, buckets = one_worker_run(method, profile + ahl_steps, ratio=ratio)
    ex = exchanges(calls, buckets)
    assert [p[0] for p in plans] == ["profile"] * profile + ["ahl"] * ahl_steps
    assert all(p[2] == pytest.approx(ratio) for p in plans[profile:])
    assert len(ex) == profile + ahl_steps  # a commit per iteration (H_i = 1 here)

    def dense(e):
        return sorted(e[0]) == sorted(e[1]) and all(4 * b <= u < 4 * b + HEADER_SLACK
                                                    for b, u in zip(sorted(buckets), sorted(e[0])))

    for e in ex[:profile]:
        assert dense(e), e  # profiling commits are the dense fp32 delta
    # The first AHL commit went dense too when this test was written (the module's ASHL worker, not
    # the harness, decides it; the test allows that one); every later one is top-k at r0.
    topk = [e for e in ex[profile:] if not dense(e)]
    assert len(topk) >= ahl_steps - 1
    for ups, downs in topk:
        for b, up in zip(sorted(buckets), sorted(ups)):
            lo, hi = topk_reference(b, ratio)
            assert lo <= up < hi + HEADER_SLACK, (b, up, lo, hi)
        assert sum(ups) < 8 * ratio * lm.n + 2 * HEADER_SLACK  # against the fp32 model's 4 n
        within_header(downs, [4 * b for b in buckets])  # the fp32 model back


def test_adsp_commits_the_fp32_delta_and_gets_the_model_back(lm):
    # ADSP: uncompressed commits (its plan's ratio is 1) at a rate it searches per period; the reply is
    # the model. time_scale 0.1 makes its period (1 reference second x K) 0.1 s, so a few iterations commit.
    calls, plans, buckets = one_worker_run("adsp", 6, time_scale=0.1)
    assert all(p[0] == "adsp" and p[2] == 1.0 for p in plans)
    ex = exchanges(calls, buckets)
    assert ex, "no ADSP commit in 6 iterations of a 0.1 s period"
    for ups, downs in ex:
        within_header(ups, [4 * b for b in buckets])
        within_header(downs, [4 * b for b in buckets])


def block4_reference(n, block=64, bits=4):
    """docs/codecs.md, block: 16 + 4 ceil(n / B) + ceil(n bits / 8) bytes."""
    return 16 + 4 * (-(-n // block)) + (-(-n * bits // 8))


@pytest.mark.parametrize("method", P.STREAMING_METHODS)
def test_streaming_diloco_sends_each_fragment_at_four_bits_and_the_2way_form_gets_four_bits_back(lm, method):
    torch = pytest.importorskip("torch")
    ashl = pytest.importorskip("ashl")
    import ashl.torch as at
    import ashl_worker
    L = lm.L
    torch.set_num_threads(1)
    H = 4
    a = lm_args(method, local_steps=H)
    a.fabric = ashl.InprocFabric()
    model = L.make_model(1)
    servers = ashl_worker.fragment_servers(a, model, fabric=a.fabric)
    sizes = at.layer_fragment_sizes(model, P.STREAMING["fragments"])
    assert len(sizes) == 4 and sum(sizes) == lm.n
    calls = []
    opt = ashl_worker.StreamingRun(L.inner_optimizer(model.parameters(), a.config, a), model,
                                   [[f"fragment{f}"] for f in range(4)], a,
                                   link=lambda d, b: calls.append((d, int(b))), batch_size=L.BATCH)
    try:
        assert opt.codecs == ["block4:64"] * 4
        D = _data()
        for s in range(2 * H):  # fragment p syncs after step H + p (staggered by H / P), fragment 0 again at 2 H
            opt.zero_grad()
            L.loss(model, L.train_batch(D, 1, 0, s, L.BATCH)).backward()
            opt.step()
        opt.sd.finish()
        assert opt.commits == 5
    finally:
        opt.leave()
        for s in servers:
            s.join()
    ups = [b for d, b in calls if d == "up"]
    downs = [b for d, b in calls if d == "down"]
    synced = sizes + sizes[:1]  # fragments 0, 1, 2, 3, 0
    within_header(ups, [block4_reference(n) for n in synced])  # 4.5 bits an element up
    if method == "streaming_diloco_4bit_2way":
        within_header(downs, [block4_reference(n) for n in synced])  # and back
    else:
        within_header(downs, [4 * n for n in synced])  # the fragment's fp32 values back


# ------------------------------------------------------------------ method lists

def test_the_protocol_the_lm_workload_and_its_grid_name_the_same_methods():
    run = _lm_run()
    with open(os.path.join(EXAMPLES, "lm", "grid.json")) as f:
        grid = json.load(f)
    W = run.WORKLOAD
    assert set(grid["methods"]) == set(W.methods)  # a grid row for every method --methods takes, no other
    assert len(W.methods) == len(set(W.methods)) == 11
    assert set(P.OUTER_RIVALS) < set(P.OUTER_METHODS) and set(P.OUTER_METHODS) <= set(W.methods)
    counts = {m: len(P.grid_configs(grid, m)) for m in grid["methods"]}
    assert len(set(counts.values())) == 1, counts  # the same tuning budget for every method
    # "The best rival" is chosen among DDP, post-local SGD and the DiLoCo family: each in the grid.
    assert set(W.rivals) == {"ddp", "ddp_localsgd"} | set(P.OUTER_RIVALS)
    assert set(W.rivals) <= set(grid["methods"])
    assert W.defaults["best_ddp_stand_in"] in W.rivals
    for m in W.methods:
        assert m in P.LABEL and m in P.KNOWN_METHODS
