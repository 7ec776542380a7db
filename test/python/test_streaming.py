"""ashl.torch.StreamingDiLoCo end to end (docs/torch.md, "Streaming
fragments"): two workers in threads of this process, one server per fragment
(Local SGD, model deltas) over an InprocFabric; H = 4, P = 2 fragments of
whole parameter tensors, tau = 1, alpha = 1/2. The steps are multiples of
1/64, so every sum, mean and half-mix is exact in float32 and the servers'
parameters must equal a numpy lock-step computation of the rule bit for bit,
whatever the threads' timing. With DiLoCo's servers (policy "diloco") the
outer optimizer runs per fragment: at outer lr 1 without momentum the same
bits as plain averaging, at lr 0.7 / momentum 0.9 different on every
element. With a link hook (the examples' emulated links) each fragment's
exchange runs on a thread of its own and gives the same bits; with the
servers' 4-bit codec (block4 at ratio 0.125) every fragment commit is
block-quantized and crosses the link at about 4.5 bits per element. Bad
parameters are refused by name."""
import threading

import numpy as np
import pytest

import ashl

torch = pytest.importorskip("torch")
from ashl import torch as at  # noqa: E402

H, P, TAU, ALPHA, STEPS, M = 4, 2, 1, 0.5, 18, 2


def model_of():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))  # tensors of 6, 2, 4, 2 elements
    return m


def w0(n):
    return (np.arange(n) % 5).astype(np.float32) * np.float32(0.25)


def step_value(k, t, n):
    i = np.arange(n, dtype=np.float32)
    return (np.float32(k + 1) / 8 + i / 64 + np.float32(t % 3) / 32).astype(np.float32)


def reference(n, frag_of):
    local = [w0(n) for _ in range(M)]
    ref = [w0(n) for _ in range(M)]
    glob = w0(n)
    pending = [w0(n), w0(n)]
    for t in range(1, STEPS + 1):
        for k in range(M):
            local[k] = local[k] + step_value(k, t, n)
        s = t - 1  # the merge of the fragment synced after step t - 1
        if s >= H and s % 4 in (0, 2):
            q = 0 if s % 4 == 0 else 1
            sel = frag_of == q
            for k in range(M):
                local[k][sel] = np.float32(0.5) * local[k][sel] + np.float32(0.5) * pending[q][sel]
                ref[k][sel] = pending[q][sel]
        if t >= H and t % 4 in (0, 2):
            p = 0 if t % 4 == 0 else 1
            sel = frag_of == p
            for k in range(M):
                glob[sel] = glob[sel] + np.float32(0.5) * (local[k][sel] - ref[k][sel])
            pending[p] = glob.copy()
    return glob


class RecordingLink:
    """A link hook that holds nothing and records each call: (direction,
    bytes, the calling thread)."""

    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def __call__(self, direction, nbytes):
        with self.lock:
            self.calls.append((direction, int(nbytes), threading.current_thread()))


def run_job(policy, policy_params, model=model_of, links=None, server_kw=None, seen=None):
    """The job; links[k]: worker k's link hook (None: none); seen[k], when
    given, gets worker k's fragment codecs and its training thread."""
    fabric = ashl.InprocFabric()
    sizes = at.layer_fragment_sizes(model(), P)
    n = sum(sizes)
    init = w0(n)
    servers = []
    for f in range(P):
        lo = sum(sizes[:f])
        srv = ashl.Server(size=sizes[f], initial=init[lo:lo + sizes[f]].copy(), policy=policy,
                          policy_params={"local_steps": H, **policy_params}, workers=M, fabric=fabric, listen=f"fragment{f}",
                          insecure=True, no_worker_grace=20.0, **(server_kw or {}))
        srv.start()
        servers.append(srv)
    errors, syncs = [None] * M, [0] * M

    def work(k):
        try:
            net = model()
            inner = torch.optim.SGD(net.parameters(), lr=1.0)
            sd = at.StreamingDiLoCo(inner, net, [[f"fragment{f}"] for f in range(P)], fragments=P, local_steps=H,
                                    delay=TAU, alpha=ALPHA, rank=k, fabric=fabric, insecure=True, timeout=20.0,
                                    link=None if links is None else links[k])
            assert sd.fragment_sizes() == sizes
            params = list(net.parameters())
            for t in range(1, STEPS + 1):
                g = torch.from_numpy(-step_value(k, t, n))  # SGD at lr 1: p += step_value
                o = 0
                for p in params:
                    p.grad = g[o:o + p.numel()].view_as(p).clone()
                    o += p.numel()
                sd.step()
            syncs[k] = sd.syncs
            if seen is not None:
                sd.finish()
                seen[k] = {"codecs": [w.codec for w in sd.workers], "thread": threading.current_thread(),
                           "telemetry": sd.telemetry}
            sd.leave()
        except BaseException as e:  # noqa: BLE001 (reported by the test thread)
            errors[k] = e

    threads = [threading.Thread(target=work, args=(k,)) for k in range(M)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
        assert not th.is_alive(), "a worker thread did not end"
    for srv in servers:
        srv.join()
    assert errors == [None] * M, errors
    assert syncs == [8, 8]
    return np.concatenate([srv.parameters() for srv in servers]), init, sizes


def test_streaming_fragments_end_to_end_equal_the_rule():
    got, init, sizes = run_job("local_sgd", {})
    assert sizes == [6 + 2, 4 + 2]  # layer_fragments of (6, 2, 4, 2) into 2: the first Linear, the second
    frag_of = np.array([0] * sizes[0] + [1] * sizes[1])
    want = reference(len(got), frag_of)
    assert got.tobytes() == want.tobytes(), (got, want)
    assert (got != init).all()


def test_with_a_link_each_exchange_crosses_it_on_its_own_thread_with_the_same_bits():
    # The link's holds block their caller: on the training thread a sync
    # would stall the next tau steps. Each fragment's exchange runs on a
    # thread of its own instead; the rule's bits are the same.
    links, seen = [RecordingLink() for _ in range(M)], {}
    got, _, sizes = run_job("local_sgd", {}, links=links, seen=seen)
    frag_of = np.array([0] * sizes[0] + [1] * sizes[1])
    assert got.tobytes() == reference(len(got), frag_of).tobytes()
    for k in range(M):
        ups = [b for d, b, _ in links[k].calls if d == "up"]
        downs = [b for d, b, _ in links[k].calls if d == "down"]
        assert len(ups) == len(downs) == 8  # one commit and one reply per sync
        # Dense f32 commits and replies of the fragments (0, 1, 0, 1, ...), headers on top; matched by
        # size, as the exchanges' threads may call in another order.
        want = sorted(sizes * 4)
        for n, u, d in zip(want, sorted(ups), sorted(downs)):
            assert u > 4 * n and d > 4 * n, (n, u, d)
        assert all(th is not seen[k]["thread"] for _, _, th in links[k].calls)
        tel = seen[k]["telemetry"]
        assert tel["bytes_out"] >= sum(ups) and tel["wait_seconds"] >= 0.0  # the join and the leave besides


def wide_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 16))  # tensors of 2,048, 32, 512, 16


def test_four_bit_fragment_commits_come_from_the_servers_codec():
    # DiLoCo's plans keep everything; the servers' block4 at ratio 0.125
    # turns every fragment commit into 4-bit blocks (B = 64, an f32 scale
    # each: 4.5 bits per element), the replies stay dense f32.
    links, seen = [RecordingLink() for _ in range(M)], {}
    got, init, sizes = run_job("diloco", {"outer_lr": 0.7, "outer_momentum": 0.9}, model=wide_model, links=links,
                               server_kw={"compression": "block4", "compression_ratio": 0.125}, seen=seen)
    assert sizes == [64 * 32, 32 + 32 * 16 + 16]  # the tensor runs closest to equal
    assert np.isfinite(got).all() and (got != init).any()
    for k in range(M):
        assert seen[k]["codecs"] == ["block4:64", "block4:64"]
        ups = [b for d, b, _ in links[k].calls if d == "up"]
        downs = [b for d, b, _ in links[k].calls if d == "down"]
        assert len(ups) == len(downs) == 8
        for n, u, d in zip(sorted(sizes * 4), sorted(ups), sorted(downs)):  # by size, as above
            packed = n // 2 + 4 * (-(-n // 64))  # two elements a byte, one f32 scale per block of 64
            assert packed <= u < packed + 256, (n, u)  # the payload and the message's header
            assert d >= 4 * n, (n, d)


def test_layer_fragment_sizes_and_a_link_that_is_not_callable_are_checked():
    assert at.layer_fragment_sizes(model_of(), 2) == [8, 6]
    assert at.layer_fragment_sizes(model_of(), 4) == [6, 2, 4, 2]
    with pytest.raises(ValueError, match=r"streaming\.fragments = 5"):
        at.layer_fragment_sizes(model_of(), 5)
    model = model_of()
    with pytest.raises(ValueError, match=r"link: str: must be callable"):
        at.StreamingDiLoCo(torch.optim.SGD(model.parameters(), lr=0.1), model, [["a"], ["b"]], fragments=2,
                           local_steps=8, fabric=ashl.InprocFabric(), insecure=True, link="up")


def test_streaming_diloco_runs_the_outer_optimizer_per_fragment():
    plain, _, sizes = run_job("diloco", {"outer_lr": 1.0, "outer_momentum": 0.0})
    frag_of = np.array([0] * sizes[0] + [1] * sizes[1])
    assert plain.tobytes() == reference(len(plain), frag_of).tobytes()
    nesterov, _, _ = run_job("diloco", {"outer_lr": 0.7, "outer_momentum": 0.9})
    assert (nesterov != plain).all()


@pytest.mark.parametrize("kw, match", [
    (dict(fragments=5, local_steps=8), r"streaming\.fragments = 5: must be <= the number of layers \(4\)"),
    (dict(fragments=0, local_steps=8), r"streaming\.fragments = 0"),
    (dict(fragments=2, local_steps=8, delay=8), r"streaming\.delay = 8"),
    (dict(fragments=2, local_steps=8, alpha=1.5), r"streaming\.alpha = 1\.5"),
])
def test_bad_parameters_are_refused_by_name(kw, match):
    model = model_of()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=match):
        at.StreamingDiLoCo(inner, model, [["nowhere"]] * max(1, kw["fragments"]), fabric=ashl.InprocFabric(),
                           insecure=True, **kw)
