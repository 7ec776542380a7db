"""server_params.apply_batch from Python (docs/ps.md "Batched applies"):
ashl.Server and ashl.torch.serve take it, a bad value is refused by name,
and a server with batches leaves the same parameters as one without. The
updates are small integers times a power of two, so every order of the
additions gives the same bits and the comparison does not depend on the
server thread's timing. Whether commits wait in a batch depends on that
timing (here they rarely do); the batches themselves are tested in C++
(test/ps/apply_batch.cpp, bit for bit, and ps/ucx_job over TCP)."""
import numpy as np
import pytest

import ashl


def run(fabric, name, batch, n=50000, workers=4, cycles=6):
    srv = ashl.Server(size=n, policy="asp", workers=workers, fabric=fabric, listen=name, insecure=True,
                      apply_batch=batch)
    srv.start()
    ws = [np.zeros(n, dtype=np.float32) for _ in range(workers)]
    wks = [ashl.Worker(ws[k], [name], rank=k, fabric=fabric, insecure=True) for k in range(workers)]
    for c in range(cycles):
        for k, wk in enumerate(wks):  # every worker's commit leaves before any waits
            while not wk.iteration_done():
                pass
            wk.commit(((np.arange(n) + 3 * k + c) % 9 - 4).astype(np.float32) * np.float32(1 / 64))
        for wk in wks:
            wk.wait()
    for wk in wks:
        wk.leave()
    srv.join()
    return srv.parameters(), srv.telemetry


def test_apply_batch_is_named_and_batches_change_no_bit():
    fabric = ashl.InprocFabric()
    for bad in (0, 65):
        with pytest.raises(ValueError, match=rf"server\.apply_batch = {bad}: must be in 1\.\.64"):
            ashl.Server(size=8, policy="asp", fabric=fabric, listen=f"bad{bad}", insecure=True, apply_batch=bad)
    one, t1 = run(fabric, "one", 1)
    many, t8 = run(fabric, "many", 8)
    assert one.tobytes() == many.tobytes() and one.any()
    assert t1["core"]["commits_applied"] == t8["core"]["commits_applied"] == 24
    assert t1["batched_applies"] == t1["batched_commits"] == 0
    assert t8["batched_commits"] >= 2 * t8["batched_applies"]  # a batched pass adds two or more
    assert sum(t8["wire_refused_by_reason"].values()) == 0


def test_serve_takes_apply_batch():
    torch = pytest.importorskip("torch")
    from ashl import torch as at
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", num_workers=1, server_addresses=("server0",), insecure=True)
    model = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match=r"server\.apply_batch = 65: must be in 1\.\.64"):
        at.serve(model, sjob, "asp", fabric=fabric, background=True, apply_batch=65)
    srv = at.serve(model, sjob, "asp", fabric=fabric, background=True, apply_batch=8, no_worker_grace=0.2)
    srv.join()  # no worker came: it ends by itself
    assert srv.telemetry["batched_applies"] == 0
