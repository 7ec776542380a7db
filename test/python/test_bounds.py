"""Counts and durations from Python are bounded by name (
rules/job_limits.hpp): ashl.Worker(..., timeout=1e300) reported
worker.timeout_ms = -9223372036854775808 (an out-of-range llround), and a
launcher's WORLD_SIZE or ASHL_NUM_SERVERS had no upper bound."""
import numpy as np
import pytest

import ashl
from ashl import _ashl


def test_a_duration_past_the_bound_is_refused_by_name():
    fabric = ashl.InprocFabric()
    w = np.zeros(8, dtype=np.float32)
    for bad in (1e300, 1e10, float("inf")):
        with pytest.raises(ValueError, match=r"worker\.timeout = ") as e:
            ashl.Worker(w, ["nobody"], fabric=fabric, insecure=True, timeout=bad)
        assert "-9223372036854775808" not in str(e.value)
    with pytest.raises(ValueError, match=r"worker\.timeout = 1e\+300: must be at most 1000000000 seconds "
                                         r"\(ps::max_duration_seconds\)"):
        ashl.Worker(w, ["nobody"], fabric=fabric, insecure=True, timeout=1e300)
    with pytest.raises(ValueError, match=r"worker\.reconnect = 1e\+20: must be at most"):
        ashl.Worker(w, ["nobody"], fabric=fabric, insecure=True, reconnect=1e20)
    with pytest.raises(ValueError, match=r"worker\.timeout = nan: must be >= 0 seconds and finite"):
        ashl.Worker(w, ["nobody"], fabric=fabric, insecure=True, timeout=float("nan"))
    with pytest.raises(ValueError, match=r"server\.worker_timeout = 1e\+300: must be at most"):
        ashl.Server(size=8, policy="asp", fabric=fabric, listen="s", insecure=True, worker_timeout=1e300)
    with pytest.raises(ValueError, match=r"server\.no_worker_grace = 1e\+12: must be at most"):
        ashl.Server(size=8, policy="asp", fabric=fabric, listen="s", insecure=True, no_worker_grace=1e12)


def test_worker_counts_past_the_bound_are_refused_by_name():
    fabric = ashl.InprocFabric()
    assert _ashl.MAX_WORKERS == 65536 and _ashl.MAX_SERVERS == 1024
    with pytest.raises(ValueError, match=r"workers = 100000000: must be at most 65536 \(ps::max_workers\)"):
        ashl.Server(size=8, policy="asp", fabric=fabric, listen="s", insecure=True, workers=100000000)


def test_launcher_counts_are_bounded_before_anything_is_sized_by_them(monkeypatch):
    for v in ("ASHL_ROLE", "ASHL_NUM_SERVERS", "ASHL_SERVER_ADDR", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("ASHL_NUM_SERVERS", "1000000000")  # a list of a billion addresses before
    with pytest.raises(ValueError, match=r"ASHL_NUM_SERVERS = '1000000000': must be at most 1024 \(ps::max_servers\)"):
        ashl.launcher_flags()
    monkeypatch.delenv("ASHL_NUM_SERVERS")
    monkeypatch.setenv("WORLD_SIZE", str(10 ** 12))
    with pytest.raises(ValueError, match=r"WORLD_SIZE = '1000000000000': must be at most 66560"):
        ashl.launcher_flags()
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_PORT", "99999")
    with pytest.raises(ValueError, match=r"MASTER_PORT = '99999': must be at most 65535"):
        ashl.launcher_flags()
    monkeypatch.setenv("MASTER_PORT", "29500")
    flags, source = ashl.launcher_flags()
    assert source == "torchrun" and "--num-workers" in flags
