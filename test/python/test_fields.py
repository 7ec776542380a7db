"""The native module's field tables (core/fields.hpp, docs/ps.md "Field tables"): the
Python Plan, the policy parameters a server accepts and the telemetry dicts
are read off the C++ structs' tables, so none can miss a field."""
import numpy as np
import pytest

import ashl
from ashl import _ashl


def test_plan_fields_are_worker_plans_in_wire_order():
    names = [n for n, _ in _ashl.plan_fields()]
    assert names == ["local_iterations", "commit_interval_us", "batch_size", "stage", "data_share",
                     "compression_ratio", "codec_bits", "codec_block"]
    assert [f.name for f in ashl.Plan.__dataclass_fields__.values()] == names
    p = ashl.Plan.from_dict({**_ashl.plan_defaults(), "commit_interval_us": 250000, "stage": "adsp"})
    assert p.commit_interval == pytest.approx(0.25)
    assert p.local_iterations == 1 and p.compression_ratio == 1.0
    assert p.codec_bits == 0 and p.codec_block == 0  # the codec's defaults


def test_every_policy_parameter_is_accepted_by_name_and_unknown_ones_are_named():
    fields = dict(_ashl.policy_fields())
    assert len(fields) == 52 and all(fields.values())  # every one has its help
    assert "min_workers" in fields  # the round policies' (docs/elastic.md E3)
    assert "stragglers" in fields  # coded_bsp's, missing from the old hand-written list
    fabric = ashl.InprocFabric()
    srv = ashl.Server(size=8, policy="coded_bsp", policy_params={"stragglers": 1}, workers=3, fabric=fabric,
                      listen="s0", insecure=True)
    assert srv.telemetry["core"]["joins"] == 0
    with pytest.raises(ValueError, match=r"policy\.h_ahll = \"3\": unknown policy parameter \(known: workers "):
        ashl.Server(size=8, policy="ashl", policy_params={"h_ahll": 3}, fabric=fabric, listen="s1", insecure=True)
    with pytest.raises(ValueError, match=r"policy\.staleness = \"True\": has the wrong type"):
        ashl.Server(size=8, policy="ssp", policy_params={"staleness": True}, fabric=fabric, listen="s2",
                    insecure=True)


def test_telemetry_dicts_carry_every_counter():
    fabric = ashl.InprocFabric()
    srv = ashl.Server(size=4, policy="asp", workers=1, fabric=fabric, listen="s0", insecure=True)
    srv.start()
    w = np.zeros(4, dtype=np.float32)
    wk = ashl.Worker(w, ["s0"], fabric=fabric, insecure=True)
    t = wk.telemetry
    # Counters the hand-written dict had missed.
    assert "unauthenticated_dropped" in t["transport"]
    assert t["plans"] >= 1 and t["plan_changes"] >= 1
    s = srv.telemetry
    for name in ("snapshots", "unsendable", "worker_errors", "checkpoint_failures", "restored_version"):
        assert name in s, name
    assert s["core"]["refused"] == 0 and set(s["core"]["refused_by_reason"]) >= {"non_finite", "samples", "store_full"}
    assert s["wire_refused"] == 0 and sum(s["wire_refused_by_reason"].values()) == 0
    assert set(s["wire_refused_by_reason"]) >= {"receive_budget", "incarnation", "job", "stale"}
    wk.leave()
    srv.join()


def test_push_is_acknowledged_without_the_parameters():
    # Worker.push (ps::worker::push, docs/ps.md "The worker"): ASP applies every push,
    # the caller's buffer keeps its values until pull() fetches them.
    fabric = ashl.InprocFabric()
    srv = ashl.Server(size=6, policy="asp", workers=1, fabric=fabric, listen="s0", insecure=True)
    srv.start()
    w = np.zeros(6, dtype=np.float32)
    wk = ashl.Worker(w, ["s0"], fabric=fabric, insecure=True)
    g = np.full(6, 0.5, dtype=np.float32)
    w[:] = 9.0  # what the caller holds; a push leaves it
    for _ in range(3):
        while not wk.iteration_done():
            pass
        wk.push(g)
        wk.wait()
        assert (w == 9.0).all()
    assert wk.telemetry["pushes"] == 3
    wk.pull()
    wk.wait()
    assert w[0] != 9.0 and (w == w[0]).all()  # the servers' parameters, three updates on
    wk.leave()
    srv.join()


def test_apply_threads_are_an_argument_and_change_no_bit():
    # server_params.apply_threads (docs/ps.md "Apply threads"): a bad count is named; a
    # shard of 40,000 elements (two parts) applied by 2 threads ends with the
    # same bits as by 1.
    fabric = ashl.InprocFabric()
    for bad in (0, 65):
        with pytest.raises(ValueError, match=rf"server\.apply_threads = {bad}: must be in \[1, 64\]"):
            ashl.Server(size=8, policy="asp", fabric=fabric, listen=f"bad{bad}", insecure=True, apply_threads=bad)
    n = 40000
    g = (np.arange(n, dtype=np.float32) % 97 - 48) * np.float32(1e-3)
    finals = []
    for threads in (1, 2):
        name = f"t{threads}"
        srv = ashl.Server(size=n, policy="asp", workers=1, fabric=fabric, listen=name, insecure=True,
                          apply_threads=threads)
        srv.start()
        w = np.zeros(n, dtype=np.float32)
        wk = ashl.Worker(w, [name], fabric=fabric, insecure=True)
        for k in range(3):
            while not wk.iteration_done():
                pass
            wk.push(g * np.float32(k + 1))
            wk.wait()
        wk.pull()
        wk.wait()
        finals.append(w.copy())
        wk.leave()
        srv.join()
    assert finals[0].tobytes() == finals[1].tobytes() and finals[0].any()
