"""trust_local_lanes from Python (docs/ps.md "Lanes without CRC"): ashl.Server,
ashl.Worker, ashl.torch.serve and DistributedOptimizer take it; over a fabric
whose peers are on this host, trusted lanes send commits and replies without
a CRC and give the worker the same bits as checked lanes; an end that does
not trust the lane refuses the first unchecked message by name."""
import numpy as np
import pytest

import ashl


def _run(fabric, name, server_trusts, worker_trusts):
    n = 5000
    g = (np.arange(n, dtype=np.float32) % 97 - 48) * np.float32(1e-3)
    srv = ashl.Server(size=n, policy="asp", workers=1, fabric=fabric, listen=name, insecure=True,
                      trust_local_lanes=server_trusts, no_worker_grace=1.0, worker_timeout=1.0)
    srv.start()
    w = np.zeros(n, dtype=np.float32)
    try:
        wk = ashl.Worker(w, [name], fabric=fabric, insecure=True, timeout=5.0, trust_local_lanes=worker_trusts)
        for k in range(3):
            while not wk.iteration_done():
                pass
            wk.commit(g * np.float32(k + 1))
            wk.wait()
        tel = wk.telemetry
        wk.leave()
    finally:
        srv.join()
    return w.copy(), tel, srv.telemetry


def test_trusted_local_lanes_carry_no_crc_and_change_no_bit():
    fabric = ashl.InprocFabric(same_host=True)
    checked, wt, st = _run(fabric, "checked", False, False)
    assert wt["unchecked_in"] == 0 and st["unchecked_in"] == 0
    trusted, wt, st = _run(fabric, "trusted", True, True)
    assert trusted.tobytes() == checked.tobytes() and trusted.any()
    assert wt["unchecked_out"] == 3 and st["unchecked_in"] == 3   # every commit
    assert wt["unchecked_in"] == 4 and st["unchecked_out"] == 4   # the join's reply and three more
    # Not on this host (the default fabric): trusted ends keep the CRC.
    remote, wt, st = _run(ashl.InprocFabric(), "remote", True, True)
    assert remote.tobytes() == checked.tobytes()
    assert wt["unchecked_out"] == 0 and st["unchecked_out"] == 0


def test_an_end_that_does_not_trust_the_lane_refuses_by_name():
    fabric = ashl.InprocFabric(same_host=True)
    with pytest.raises(Exception, match=r"unchecked \(no CRC\) is taken only from a peer on this host"):
        _run(fabric, "distrust", False, True)


def test_serve_and_distributed_optimizer_take_it():
    torch = pytest.importorskip("torch")
    from ashl import torch as at
    from torch_testing import jobs
    fabric = ashl.InprocFabric(same_host=True)
    sjob, (wjob,) = jobs()
    torch.manual_seed(3)
    model = torch.nn.Linear(4, 2)
    srv = at.serve(model, sjob, "bsp", "none", fabric=fabric, background=True, trust_local_lanes=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job=wjob, fabric=fabric,
                                  trust_local_lanes=True)
    x = torch.randn(8, 4)
    for _ in range(3):
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
    opt.wait()
    tel = opt.telemetry
    opt.leave()
    srv.join()
    assert tel["unchecked_out"] >= 3 and tel["unchecked_in"] >= 4, tel
