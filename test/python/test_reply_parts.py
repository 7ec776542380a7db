"""server_params.reply_part_bytes from Python (docs/ps.md "Messages"): ashl.Server
and ashl.torch.serve take it, a bad size is refused by name, and a pull
answered in parts gives the worker the same bits as one message, with the
parts' CRCs from the server core's pass (no pass of the server's own)."""
import numpy as np
import pytest

import ashl


def test_reply_part_bytes_is_named_and_parts_change_no_bit():
    fabric = ashl.InprocFabric()
    for bad in (1, 4095):
        named = rf"server\.reply_part_bytes = {bad}: must be 0 \(one message\) or >= 4096"
        with pytest.raises(ValueError, match=named):
            ashl.Server(size=8, policy="asp", fabric=fabric, listen=f"bad{bad}", insecure=True, reply_part_bytes=bad)
    n = 40000  # 160,000 bytes: 10 parts of 4,000 elements at 16,000 bytes
    g = (np.arange(n, dtype=np.float32) % 89 - 44) * np.float32(1e-3)
    finals, parts = [], []
    for part_bytes in (0, 16000):
        name = f"p{part_bytes}"
        srv = ashl.Server(size=n, policy="asp", workers=1, fabric=fabric, listen=name, insecure=True,
                          reply_part_bytes=part_bytes)
        srv.start()
        w = np.zeros(n, dtype=np.float32)
        wk = ashl.Worker(w, [name], fabric=fabric, insecure=True)
        for k in range(3):
            while not wk.iteration_done():
                pass
            wk.commit(g * np.float32(k + 1))  # the pull rides along: each reply a new version
            wk.wait()
        finals.append(w.copy())
        parts.append(wk.telemetry["reply_parts"])
        wk.leave()
        srv.join()
        t = srv.telemetry
        assert t["part_crc_passes"] == 0
        assert t["reply_parts"] == parts[-1]
    assert finals[0].tobytes() == finals[1].tobytes() and finals[0].any()
    assert parts[0] == 0 and parts[1] == 4 * 10  # the first pull's reply and three commits'


def test_serve_takes_reply_part_bytes():
    torch = pytest.importorskip("torch")
    from ashl import torch as at
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", num_workers=1, server_addresses=("server0",), insecure=True)
    model = torch.nn.Linear(3, 3)
    with pytest.raises(ValueError, match=r"server\.reply_part_bytes = 4095: must be 0 \(one message\) or >= 4096"):
        at.serve(model, sjob, "bsp", fabric=fabric, background=True, reply_part_bytes=4095)
    srv = at.serve(model, sjob, "bsp", fabric=fabric, background=True, reply_part_bytes=4096, no_worker_grace=0.2)
    srv.join()  # no worker came: it ends by itself
    assert srv.telemetry["reply_parts"] == 0
