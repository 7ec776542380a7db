"""worker_params.commit_part_bytes and commit_window from Python (docs/ps.md "Commits in parts"
item 1): ashl.Worker and ashl.torch.DistributedOptimizer take them, bad
values are refused by name, and a dense commit sent in parts leaves the
server and the worker with the same bits as the same commits sent whole,
whether the server adds its parts as they land (apply_parts_as_they_land,
the default) or applies it whole at its last part."""
import numpy as np
import pytest

import ashl


def test_commit_part_bytes_and_window_are_named_and_parts_change_no_bit():
    fabric = ashl.InprocFabric()
    srv = ashl.Server(size=8, policy="asp", workers=1, fabric=fabric, listen="named", insecure=True)
    srv.start()
    for kw, named in (({"commit_part_bytes": 4095}, r"worker\.commit_part_bytes = 4095"),
                      ({"commit_part_bytes": 4096, "commit_window": 0}, r"worker\.commit_window = 0"),
                      ({"commit_part_bytes": 4096, "commit_window": 17}, r"worker\.commit_window = 17")):
        with pytest.raises(ValueError, match=named):
            ashl.Worker(np.zeros(8, dtype=np.float32), ["named"], fabric=fabric, insecure=True, **kw)
    srv.stop()
    srv.join()
    n = 40000  # 160,000 bytes: 10 parts of 4,000 elements at 16,000 bytes
    g = (np.arange(n, dtype=np.float32) % 89 - 44) * np.float32(1e-3)
    finals, parts = [], []
    for part_bytes, as_landed in ((0, False), (16000, True), (16000, False)):
        name = f"c{part_bytes}{as_landed}"
        srv = ashl.Server(size=n, policy="asp", workers=1, fabric=fabric, listen=name, insecure=True,
                          apply_parts_as_they_land=as_landed)
        srv.start()
        w = np.zeros(n, dtype=np.float32)
        wk = ashl.Worker(w, [name], fabric=fabric, insecure=True, commit_part_bytes=part_bytes, commit_window=3)
        for k in range(3):
            while not wk.iteration_done():
                pass
            wk.commit(g * np.float32(k + 1))
            wk.wait()
        finals.append(w.copy())
        parts.append(wk.telemetry["commit_parts"])
        wk.leave()
        srv.join()
        t = srv.telemetry
        assert t["commit_parts"] == parts[-1] and t["commits_in_parts"] == (3 if part_bytes else 0)
        assert t["core"]["commits_applied"] == 3
        assert t["applied_as_landed"] == (3 if part_bytes and as_landed else 0)
    assert finals[0].tobytes() == finals[1].tobytes() == finals[2].tobytes() and finals[0].any()
    assert parts == [0, 3 * 10, 3 * 10]


def test_distributed_optimizer_commits_its_buckets_in_parts():
    torch = pytest.importorskip("torch")
    from ashl import torch as at
    from torch_testing import flat, jobs, mlp
    results = []
    for part_bytes in (0, 4096):
        fabric = ashl.InprocFabric(deterministic=True)
        sjob, (wjob,) = jobs(1)
        srv = at.serve(mlp(), sjob, "bsp", optimizer="sgd", lr=0.05, fabric=fabric, background=True,
                       bucket_cap_mb=None)
        model = mlp()
        opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", update="gradient",
                                      job=wjob, fabric=fabric, bucket_cap_mb=None, commit_part_bytes=part_bytes)
        g = torch.Generator().manual_seed(3)
        for _ in range(4):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.wait()
        results.append((flat(model), opt.telemetry["commit_parts"]))
        opt.leave()
        srv.join()
    (whole, none), (in_parts, parts) = results
    assert none == 0 and parts == 4 * 2  # 1,732 floats = 6,928 bytes: two parts a commit
    assert torch.equal(whole, in_parts) and not torch.equal(whole, flat(mlp()))
