"""The CNN comparison's protocol and link model (examples/cnn, docs/cnn.md):
bootstrap intervals, the per-seed method order, overrun flagging and
repeats, the tuning freeze, the report table, the link model's holds, and
the bytes each DDP variant puts through the costed all-reduce (torch
1.13's own hooks on a one-process gloo group, costed as a ring of nine)."""
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "cnn"))
sys.path.insert(1, os.path.join(HERE, "..", "..", "examples", "common"))

import link as lk  # noqa: E402
import protocol as P  # noqa: E402


def _cnn_run():
    """examples/cnn/run.py by its path, under its own module name: another
    workload's run.py (examples/lm) may sit earlier on sys.path."""
    import importlib.util
    name = "ashl_examples_cnn_run"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, "..", "..", "examples", "cnn", "run.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]

INF = math.inf


# ------------------------------------------------------------------ bootstrap

def test_bootstrap_of_two_values_has_the_exact_percentile_interval():
    # Resampled medians of [0, 1]: 0 (1/4), 0.5 (1/2), 1 (1/4); the 2.5 % and 97.5 % points are 0 and 1.
    point, lo, hi = P.bootstrap_ci([0.0, 1.0], n_boot=4000, seed=3)
    assert (point, lo, hi) == (0.5, 0.0, 1.0)


def test_bootstrap_interval_holds_the_median_within_the_data_and_is_reproducible():
    v = [100.0, 105.0, 110.0, 112.5, 190.0]
    point, lo, hi = P.bootstrap_ci(v, n_boot=5000, seed=1)
    assert point == 110.0
    assert 100.0 <= lo <= point <= hi <= 190.0
    assert lo < hi
    assert P.bootstrap_ci(v, n_boot=5000, seed=1) == (point, lo, hi)
    assert P.bootstrap_ci([7.0] * 5) == (7.0, 7.0, 7.0)


def test_bootstrap_with_unreached_targets_keeps_them_infinite():
    point, lo, hi = P.bootstrap_ci([100.0, INF, INF, INF, 120.0], n_boot=2000)
    assert point == INF and hi == INF and lo >= 100.0


def test_paired_ratio_of_medians_and_its_interval():
    ddp = [200.0, 220.0, 240.0, 210.0, 230.0]
    assert P.paired_ratio_ci([0.5 * t for t in ddp], ddp) == (0.5, 0.5, 0.5)
    r, lo, hi = P.paired_ratio_ci([100.0, 130.0, 90.0, 150.0, 110.0], ddp, n_boot=4000)
    assert r == pytest.approx(110.0 / 220.0)
    assert lo < r < hi < 1.0
    # DDP never reached the target: ASHL's ratio is a bound toward 0; neither: undefined.
    assert P.paired_ratio_ci([100.0], [INF])[0] == 0.0
    assert math.isnan(P.paired_ratio_ci([INF], [INF])[0])
    with pytest.raises(ValueError, match="pair"):
        P.paired_ratio_ci([1.0, 2.0], [1.0])


# ------------------------------------------------------------------ order

def test_the_order_is_a_permutation_random_per_seed_and_reproducible():
    methods = list(P.ALL_METHODS)
    orders = [P.run_order(methods, s) for s in range(1, 6)]
    for o in orders:
        assert sorted(o) == sorted(methods)
    assert orders == [P.run_order(methods, s) for s in range(1, 6)]
    assert len({tuple(o) for o in orders}) == 5
    assert len({o[0] for o in orders}) > 1  # no method always first
    assert P.run_order(methods, 1) == P.run_order(list(reversed(methods)), 1)  # the input order does not matter


# ------------------------------------------------------------------ overruns

def test_more_than_two_percent_of_overruns_is_flagged():
    assert not P.flagged(2, 100)
    assert P.flagged(3, 100)
    assert P.flagged(0, 0)  # nothing ran


def test_a_run_beside_another_job_is_flagged():
    assert not P.flagged(0, 100, foreign=0.10)
    assert P.flagged(0, 100, foreign=0.11)  # other processes took more than a tenth of the machine
    assert not P.flagged(0, 100, foreign=None)  # not measured (rows made before the rule)


def test_a_flagged_run_is_repeated_until_clean_or_out_of_attempts():
    script = iter([(50, 1000), (10, 1000), (0, 1000)])
    row, rows = P.run_until_clean(lambda k: dict(zip(("overruns", "iterations"), next(script)), k=k), 3)
    assert [r["flagged"] for r in rows] == [True, False]
    assert row["attempt"] == 2 and row["k"] == 2
    row, rows = P.run_until_clean(lambda k: {"overruns": 900, "iterations": 1000}, 3)
    assert len(rows) == 3 and row["flagged"] and row["attempt"] == 3


def test_a_run_beside_another_job_is_repeated_and_stays_flagged():
    # The retry used to recompute the flag from the overruns alone, so a run
    # that other processes crowded (foreign_busy > 10 %) was neither repeated
    # nor marked flagged in results.jsonl and the table.
    script = iter([0.5, 0.02])
    row, rows = P.run_until_clean(lambda k: {"overruns": 0, "iterations": 1000, "foreign_busy": next(script)}, 3)
    assert [r["flagged"] for r in rows] == [True, False]
    assert row["attempt"] == 2 and row["foreign_busy"] == 0.02
    row, rows = P.run_until_clean(lambda k: {"overruns": 0, "iterations": 1000, "foreign_busy": 0.9}, 1)
    assert len(rows) == 1 and row["flagged"]


# ------------------------------------------------------------------ tuning

GRID = {"methods": {"ddp": [{"lr": 0.05}, {"lr": 0.1}], "ashl": [{"lr": 0.05, "ratio": 0.1},
                                                                 {"lr": 0.05, "ratio": 0.3}]}}


def rows_for(times):
    out = []
    for (m, i, seed), t in times.items():
        out.append({"method": m, "config": GRID["methods"][m][i], "seed": seed,
                    "time_to_target_s": t, "final_accuracy": 0.89})
    return out


def test_freeze_chooses_the_lowest_median_and_refuses_missing_runs_and_test_seeds():
    times = {("ddp", 0, 101): 200.0, ("ddp", 0, 102): 210.0, ("ddp", 1, 101): 180.0, ("ddp", 1, 102): None,
             ("ashl", 0, 101): 120.0, ("ashl", 0, 102): 130.0, ("ashl", 1, 101): 100.0, ("ashl", 1, 102): 110.0}
    body = P.freeze(GRID, rows_for(times), [101, 102], ["ddp", "ashl"])
    assert body["chosen"]["ddp"]["config"] == {"lr": 0.05}  # lr 0.1's median is (180 + inf) / 2
    assert body["chosen"]["ashl"]["config"] == {"lr": 0.05, "ratio": 0.3}
    assert body["chosen"]["ashl"]["median_time_to_target_s"] == 105.0
    P.check_frozen(body, [1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="tuning seeds"):
        P.check_frozen(body, [1, 101])
    body["chosen"]["ashl"]["config"]["ratio"] = 0.1  # edited after the freeze
    with pytest.raises(ValueError, match="digest"):
        P.check_frozen(body, [1])
    del times[("ashl", 1, 102)]
    with pytest.raises(ValueError, match="ashl: 1 of 4 tuning runs missing"):
        P.freeze(GRID, rows_for(times), [101, 102], ["ddp", "ashl"])


def test_tuning_status_counts_the_runs_and_lists_them_in_order():
    rows = rows_for({("ashl", 1, 101): 100.0, ("ddp", 0, 101): None})
    rows[0].update(overrun_fraction=0.0004, flagged=False, load_start=2.0, load_end=2.54, foreign_busy=0.031)
    text = P.tuning_status(GRID, rows, [101, 102], ["ddp", "ashl"], 300.0)
    assert text.startswith("**2 of 8 tuning runs** (DDP 1/4, ASHL 1/4)")
    lines = text.splitlines()
    assert lines[4] == "| 1 | ashl | 101 | lr 0.05, ratio 0.3 | 100.0 | 0.8900 | 0.04 % | 3 % | no | 2.0-2.5 |"
    assert lines[5] == "| 2 | ddp | 101 | lr 0.05 | - | 0.8900 | - | - | no | - |"


def test_the_status_replaces_only_what_lies_between_its_markers():
    doc = f"# page\n\nbefore\n\n{P.STATUS_BEGIN}\n\nold table\n\n{P.STATUS_END}\n\nafter\n"
    new = P.splice_status(doc, "**1 of 8 tuning runs**\n\n| table |\n")
    assert new == f"# page\n\nbefore\n\n{P.STATUS_BEGIN}\n\n**1 of 8 tuning runs**\n\n| table |\n\n{P.STATUS_END}\n\nafter\n"
    assert P.splice_status(new, "**1 of 8 tuning runs**\n\n| table |\n") == new  # again: unchanged
    with pytest.raises(ValueError, match="tuning-status: end.* 0 times"):
        P.splice_status(doc.replace(P.STATUS_END, ""), "x")
    with pytest.raises(ValueError, match="2 times"):
        P.splice_status(doc + P.STATUS_BEGIN, "x")
    with pytest.raises(ValueError, match="comes before"):
        P.splice_status(f"{P.STATUS_END}\n{P.STATUS_BEGIN}\n", "x")


def test_an_unequal_grid_is_refused():
    grid = {"methods": {"ddp": [{"lr": 0.05}], "ashl": [{"ratio": 0.1}, {"ratio": 0.3}]}}
    with pytest.raises(ValueError, match="budget must be equal"):
        P.grid_configs(grid, "ddp")


def test_a_grid_value_the_method_does_not_read_is_refused():
    # Two configurations differing only in an unread value are one run twice.
    grid = {"methods": {"ashl_outer": [{"lr": 0.05, "local_steps": 8}], "ddp": [{"lr": 0.05}]}}
    with pytest.raises(ValueError, match=r"ashl_outer#0 sets local_steps, which ashl_outer does not read "
                                         r"\(it reads lr, warmup_s, ratio\)"):
        P.grid_configs(grid, "ashl_outer")
    assert P.grid_configs(grid, "ddp") == [{"lr": 0.05}]


def test_the_committed_grid_gives_every_method_the_same_budget():
    import json
    with open(os.path.join(HERE, "..", "..", "examples", "cnn", "grid.json")) as f:
        grid = json.load(f)
    assert set(grid["methods"]) == set(P.ALL_METHODS + P.OUTER_METHODS)  # the DiLoCo rows too
    counts = {m: len(P.grid_configs(grid, m)) for m in grid["methods"]}
    assert set(counts.values()) == {8}
    for m, knob in (P.KNOB | P.OUTER_KNOB).items():
        assert len({c[knob] for c in grid["methods"][m]}) == 2


def test_ashl_outer_tunes_a_knob_its_policy_reads():
    # ashl_diloco plans H_i itself and refuses local_steps; its grid varies r0.
    assert P.OUTER_KNOB["ashl_outer"] == "ratio"
    assert P.shown_config("ashl_outer", {"lr": 0.05, "warmup_s": 0.0, "local_steps": 8, "ratio": 0.3}) == \
        {"lr": 0.05, "warmup_s": 0.0, "ratio": 0.3}


def test_streaming_diloco_4bit_is_refused_only_without_the_diloco_policy():
    # Until its fragments and 4-bit codec were wired it was refused by name
    # (NOT_WIRED) even where the module had the diloco policy.
    assert "streaming_diloco_4bit" not in P.NOT_WIRED
    assert P.missing_policies(["streaming_diloco_4bit"], ["bsp", "diloco"]) is None
    why = P.missing_policies(["streaming_diloco_4bit"], ["bsp"])
    assert "streaming_diloco_4bit (Streaming DiLoCo, 4-bit) needs the diloco policy" in why


def test_streaming_diloco_4bit_runs_the_mlp_rows_fragments_and_a_four_bit_codec_on_its_servers():
    cfg = _cnn_run().DEFAULT_CONFIG  # the CNN's DiLoCo rows' H and outer optimizer
    # P, tau and alpha of docs/perf/diloco-streaming.md's streaming_diloco8_4bit row, H = 8 as both.
    assert P.streaming_worker_settings(cfg) == {"fragments": 4, "local_steps": 8, "delay": 2, "alpha": 0.5}
    assert P.streaming_worker_settings(dict(cfg, local_steps=32))["local_steps"] == 32  # the grid's other H
    assert P.fragment_server_settings("streaming_diloco_4bit", cfg, 9) == {
        "policy": "diloco", "policy_params": {"local_steps": 8, "outer_lr": 0.7, "outer_momentum": 0.9},
        "workers": 9, "compression": "block4", "compression_ratio": 0.125}
    with pytest.raises(ValueError, match=r"method = 'diloco': only streaming_diloco_4bit and "
                                         r"streaming_diloco_4bit_2way run fragment servers"):
        P.fragment_server_settings("diloco", cfg, 9)


def test_streaming_diloco_4bit_2way_is_streaming_diloco_4bit_with_four_bit_replies():
    cfg = _cnn_run().DEFAULT_CONFIG
    # The same schedule and commits; every fragment server also answers a pull with block4 (docs/ps.md,
    # "Compressed replies"), and only that differs from streaming_diloco_4bit's servers.
    assert P.streaming_worker_settings(cfg) == {"fragments": 4, "local_steps": 8, "delay": 2, "alpha": 0.5}
    assert P.fragment_server_settings("streaming_diloco_4bit_2way", cfg, 9) == {
        "policy": "diloco", "policy_params": {"local_steps": 8, "outer_lr": 0.7, "outer_momentum": 0.9},
        "workers": 9, "compression": "block4", "compression_ratio": 0.125, "reply_compression": "block4"}
    assert "reply_compression" not in P.fragment_server_settings("streaming_diloco_4bit", cfg, 9)
    assert P.STREAMING_METHODS == ("streaming_diloco_4bit", "streaming_diloco_4bit_2way")
    assert P.NEEDS_POLICY["streaming_diloco_4bit_2way"] == "diloco"
    assert P.OUTER_KNOB["streaming_diloco_4bit_2way"] == "local_steps"


def test_the_single_server_diloco_methods_serve_their_policy_with_the_outer_optimizer():
    cfg = _cnn_run().DEFAULT_CONFIG
    outer = {"outer_lr": 0.7, "outer_momentum": 0.9}
    assert P.outer_policy_settings("diloco", cfg, 0.5) == {
        "policy": "diloco", "policy_params": {"local_steps": 8, **outer}}
    assert P.outer_policy_settings("async_local_sgd", dict(cfg, local_steps=32), 0.5) == {
        "policy": "async_diloco", "policy_params": {"local_steps": 32, **outer}}
    # ASHL's planner (the reference experiment's settings) with r0 = ratio and the workload's switch loss.
    ashl_outer = {"profile_iterations": 5, "h_ahl": 8, "h_shl": 2, "shl_staleness": 3, "planner": "profile",
                  "profile_trim": 2, "compression_ratio": 0.3, "switch_loss": 0.5, **outer}
    assert P.outer_policy_settings("ashl_outer", cfg, 0.5) == {"policy": "ashl_diloco", "policy_params": ashl_outer}
    with pytest.raises(ValueError, match=r"method = 'streaming_diloco_4bit': not a DiLoCo-family method served by "
                                         r"one server"):
        P.outer_policy_settings("streaming_diloco_4bit", cfg, 0.5)
    with pytest.raises(ValueError, match=r"method = 'ashl': not a DiLoCo-family method"):
        P.outer_policy_settings("ashl", cfg, 0.5)


def test_ashl_diloco_sw_is_ashl_outer_with_power_one_half_staleness_weights():
    # The simulator's fix for the asynchronous form's collapse at outer momentum 0.9 (docs/perf/diloco.md,
    # "Stability of the asynchronous form"; examples/experiment_common.hpp's ashl_diloco_sw).
    cfg = _cnn_run().DEFAULT_CONFIG
    assert P.outer_policy_settings("ashl_diloco_sw", dict(cfg, ratio=0.1), 0.4) == {
        "policy": "ashl_diloco",
        "policy_params": {"profile_iterations": 5, "h_ahl": 8, "h_shl": 2, "shl_staleness": 3, "planner": "profile",
                          "profile_trim": 2, "compression_ratio": 0.1, "switch_loss": 0.4, "outer_lr": 0.7,
                          "outer_momentum": 0.9, "staleness_weight": "power", "staleness_exponent": 0.5}}
    sw = P.outer_policy_settings("ashl_diloco_sw", cfg, 0.5)["policy_params"]
    base = P.outer_policy_settings("ashl_outer", cfg, 0.5)["policy_params"]
    assert {k: v for k, v in sw.items() if k not in base} == {"staleness_weight": "power", "staleness_exponent": 0.5}
    assert all(sw[k] == v for k, v in base.items())
    assert P.OUTER_KNOB["ashl_diloco_sw"] == "ratio"  # it plans H_i as ashl_outer, so its grid varies r0
    assert P.shown_config("ashl_diloco_sw", {"lr": 0.05, "warmup_s": 0.0, "local_steps": 8, "ratio": 0.3}) == \
        {"lr": 0.05, "warmup_s": 0.0, "ratio": 0.3}


def test_every_diloco_method_is_in_each_method_table():
    for m in ("streaming_diloco_4bit_2way", "ashl_diloco_sw"):
        assert m in P.OUTER_METHODS and m in P.KNOWN_METHODS and m in P.LABEL and m in P.NEEDS_POLICY
        assert m not in P.ALL_METHODS and m not in P.NOT_WIRED
    assert set(P.NEEDS_POLICY) == set(P.OUTER_METHODS) == set(P.OUTER_KNOB)
    assert P.KNOWN_METHODS == P.ALL_METHODS + P.OUTER_METHODS
    assert len(set(P.KNOWN_METHODS)) == len(P.KNOWN_METHODS)
    assert P.missing_policies(["streaming_diloco_4bit_2way", "ashl_diloco_sw"], ["diloco", "ashl_diloco"]) is None
    why = P.missing_policies(["ashl_diloco_sw"], ["diloco"])
    assert "ashl_diloco_sw (ASHL + outer optimizer, staleness-weighted) needs the ashl_diloco policy" in why


# ------------------------------------------------------------------ report

def row(method, seed, t, acc=0.89):
    return {"method": method, "seed": seed, "time_to_target_s": t, "final_accuracy": acc,
            "measured_ms_per_iteration": 350.0, "emulated_ms_per_iteration": 308.0, "bytes_up_per_worker": 3.7e8,
            "bytes_down_per_worker": 3.7e8, "overrun_fraction": 0.001, "flagged": False, "config": {"lr": 0.05},
            "samples": 600000, "budget_s": 300.0}


def test_the_table_has_intervals_the_best_ddp_variant_and_the_verdict():
    rows = []
    for s, (d, f16, a) in enumerate([(225, 200, 100), (240, 190, 105), (225, 210, 95), (230, 205, 110),
                                     (235, 195, 100)], start=1):
        rows += [row("ddp", s, d), row("ddp_fp16", s, f16), row("ashl", s, a)]
    s = P.summarize(rows, 0.88, 300.0, n_boot=2000)
    assert s["best_ddp"] == "ddp_fp16"
    r, lo, hi = s["ratios"]["ashl/best_ddp"]
    assert r == pytest.approx(100.0 / 200.0) and lo <= r <= hi < 1.0
    text = P.report_table(s)
    assert "| DDP + fp16 hook (best DDP) |" in text
    assert "200.0 [" in text and "ASHL / plain DDP" in text
    met, why = P.goal_verdict(s)
    assert met, why
    slow = [dict(r, time_to_target_s=r["time_to_target_s"] * 1.5) if r["method"] == "ashl" else r for r in rows]
    met, why = P.goal_verdict(P.summarize(slow, 0.88, 300.0, n_boot=2000))
    assert not met and any("above 0.6" in w for w in why)


def test_the_committed_summary_reads_back_into_the_demos_headline():
    rows = [row("ddp", 1, 200.0), row("ddp", 2, 220.0), row("ashl", 1, 130.0), row("ashl", 2, None)]
    s = P.summarize(rows, 0.88, 300.0, n_boot=200)
    text = P.strict_json(s)
    assert "Infinity" not in text and "NaN" not in text  # strict JSON: a miss is null
    back = P.load_summary(text)
    assert back["ratios"] == s["ratios"]  # ASHL's median is a miss: inf survives the file
    assert math.isinf(back["ratios"]["ashl/ddp"][0])
    lines = P.protocol_result(back).splitlines()
    assert lines[0].startswith("The full protocol (4 runs, seeds 1,2, 300 s each;")
    assert any(l.startswith("- ASHL / plain DDP, time to 0.88: **") for l in lines)
    assert lines[-1].startswith("Goal (") and "not met" in lines[-1]


def test_an_unreached_target_is_shown_as_beyond_the_budget():
    s = P.summarize([row("ddp", 1, None), row("ashl", 1, 150.0)], 0.88, 300.0, n_boot=100)
    text = P.report_table(s)
    assert "> 300 [> 300, > 300]" in text
    assert "0.00x" in text  # a bound: ASHL reached it, DDP did not


def test_every_run_is_shown_by_seed_with_misses_and_flags_marked():
    rows = [row("ddp", 1, 175.0), row("ddp", 2, None), dict(row("ashl", 2, 130.0), flagged=True)]
    text = P.per_seed_table(rows, 300.0)
    lines = text.splitlines()
    assert lines[0] == "| method | seed 1 | seed 2 |"
    assert "| DDP | 175.0 | > 300 |" in lines
    assert "| ASHL |  | 130.0 * |" in lines  # seed 1 not run: an empty cell, not a number


def test_the_time_to_target_splits_into_rate_and_samples_needed():
    # DDP: 2,000 samples/s, target at 150 s (300k samples); ASHL: 4,000/s, target at 100 s (400k samples):
    # twice the rate, a third more samples needed, so 2/3 of the time.
    rows = [dict(row("ddp", s, 150.0), samples=600000) for s in (1, 2, 3)]
    rows += [dict(row("ashl", s, 100.0), samples=1200000) for s in (1, 2)] + [dict(row("ashl", 3, None),
                                                                                  samples=1200000)]
    rows += [dict(row("bsp", s, None), samples=300000) for s in (1, 2)]
    s = P.summarize(rows, 0.88, 300.0, n_boot=100)
    assert s["methods"]["ashl"]["samples_per_s"] == 4000.0
    assert s["methods"]["ashl"]["samples_to_target"] == 400000.0  # median of 400k, 400k and a miss
    lines = P.efficiency_table(s).splitlines()
    assert "| DDP | 2000 | 1.00x | 300 | 1.00x |" in lines
    assert "| ASHL | 4000 | 2.00x | 400 | 1.33x |" in lines
    assert "| BSP | 1000 | 0.50x | not reached | - |" in lines  # a miss is never a number


def test_the_milestones_are_medians_along_the_curves_with_ashls_ratios():
    curve = lambda *pts: [[t, a] for t, a in pts]
    rows = [dict(row("ddp", 1, None), curve=curve((10, 0.80), (40, 0.86), (80, 0.875))),
            dict(row("ddp", 2, None), curve=curve((20, 0.81), (60, 0.85), (90, 0.87))),
            dict(row("ddp_fp16", 1, None), curve=curve((10, 0.85), (30, 0.87))),
            dict(row("ashl", 1, None), curve=curve((5, 0.85), (20, 0.88))),
            dict(row("ashl", 2, None), curve=curve((15, 0.86), (25, 0.87), (30, 0.88)))]
    lines = P.milestone_table(rows, 300.0, "ddp_fp16", accuracies=(0.85, 0.87, 0.88)).splitlines()
    assert lines[0] == "| method | 85 % | 87 % | 88 % |"
    assert "| DDP | 50.0 | 85.0 | > 300 |" in lines  # medians of (40, 60) and (80, 90); nobody reached 88 %
    assert "| ASHL | 10.0 | 22.5 | 25.0 |" in lines
    # At 88 % only ASHL arrived: its ratio is a bound, below 25 s over the 300 s budget, not a number it is not.
    assert "| ASHL / plain DDP | 0.20x | 0.26x | < 0.08x |" in lines
    assert "| ASHL / the best DDP variant | 1.00x | 0.75x | < 0.08x |" in lines
    ashl_missed = rows[:3] + [dict(rows[3], curve=curve((5, 0.85), (20, 0.87)))]
    lines = P.milestone_table(ashl_missed, 300.0, "ddp_fp16", accuracies=(0.88,)).splitlines()
    assert "| ASHL | > 300 |" in lines and "| ASHL / plain DDP | - |" in lines  # neither arrived: nothing to say


def test_the_median_curve_takes_each_tick_every_run_has():
    rows = [dict(row("ashl", 1, 5.0), curve=[[2.5, 0.2], [5.0, 0.9], [7.5, 0.91]]),
            dict(row("ashl", 2, None), curve=[[2.5, 0.4], [5.0, 0.5]]),
            dict(row("ashl", 3, 5.0), curve=[[2.5, 0.3], [5.0, 0.88]]),
            dict(row("ddp", 1, None), curve=[[2.5, 0.1]])]
    c = P.median_curves(rows)
    assert list(c) == ["ddp", "ashl"]  # ALL_METHODS order
    assert c["ashl"] == [(2.5, 0.3), (5.0, 0.88)]  # 7.5 s: only seed 1 has it
    assert c["ddp"] == [(2.5, 0.1)]


# ------------------------------------------------------------------ bytes and links

class FakeClock:
    def __init__(self):
        self.t = 1000.0
        self.slept = []

    def now(self):
        return self.t

    def sleep(self, d):
        self.slept.append(d)
        self.t += d


def test_a_duplex_hold_takes_the_longer_direction_and_each_channel_queues():
    c = FakeClock()
    link = lk.Link(1000.0, clock=c.now, sleep=c.sleep)
    link.hold_duplex(500, 500)
    assert c.slept == [pytest.approx(0.5)]  # both directions at once: 0.5 s, not 1 s
    link.hold("up", 1000)
    link.hold("down", 1000)
    assert c.slept[1:] == [pytest.approx(1.0), pytest.approx(1.0)]
    assert link.stats()["bytes_up"] == 1500 and link.stats()["bytes_down"] == 1500


def test_the_servers_port_is_shared_by_its_workers(tmp_path):
    path = str(tmp_path / "server-link")
    port = lk.ServerPort.create(path, 2000.0)
    c = FakeClock()
    # Two fast workers (10 kB/s each) commit 1,000 bytes at the same instant through a 2 kB/s server port:
    # their own links take 0.1 s, the server's takes 0.5 s per commit, one after the other.
    w0 = lk.Link(10000.0, server=lk.ServerPort(path, 2000.0), clock=c.now, sleep=lambda d: None)
    w1 = lk.Link(10000.0, server=lk.ServerPort(path, 2000.0), clock=c.now, sleep=lambda d: None)
    assert w0.end_of("up", 1000, c.t) == pytest.approx(c.t + 0.5)
    assert w1.end_of("up", 1000, c.t) == pytest.approx(c.t + 1.0)
    # The other direction of the port (replies) is free.
    assert w1.end_of("down", 1000, c.t) == pytest.approx(c.t + 0.5)
    port.close()


def test_ring_bytes_and_the_bytes_of_each_ddp_variant():
    assert lk.ring_bytes(246824, 9) == pytest.approx(2 * 8 / 9 * 246824)
    assert lk.ring_bytes(246824, 1) == 0.0
    shapes = [(6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 400), (120,), (84, 120), (84,), (10, 84), (10,)]
    # LeNet-5 with rank 1: every weight matrix compressed, the biases as they are.
    assert P.powersgd_factor_bytes(shapes, 1) == 4 * ((6 + 25) + (16 + 150) + (120 + 400) + (84 + 120) + (10 + 84)
                                                        + 6 + 16 + 120 + 84 + 10)
    assert P.ddp_bytes_per_step("ddp_fp16", 246824, 9) == P.ddp_bytes_per_step("ddp", 246824, 9) / 2
    assert P.ddp_bytes_per_step("ddp_localsgd", 246824, 9) == 0.0
    assert P.propbatch_sizes((2.0, 3.0, 4.0), 9, 576) == [89, 89, 89, 59, 59, 59, 44, 44, 44]


@pytest.fixture(scope="module")
def gloo_one_rank():
    """A one-process gloo group; the costed all-reduce is told the ring has nine ranks."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield torch, dist
    dist.destroy_process_group()


@pytest.mark.parametrize("method", ["ddp", "ddp_fp16", "ddp_powersgd", "ddp_localsgd"])
def test_each_ddp_variant_costs_the_bytes_its_all_reduces_are_given(gloo_one_rank, method):
    torch, dist = gloo_one_rank
    import torch.nn.functional as F
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
    from torch.distributed.algorithms.model_averaging import averagers
    from torch.distributed.optim import PostLocalSGDOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP
    import cnn_common as cc

    c = FakeClock()
    link = lk.Link(8.14e6, clock=c.now, sleep=c.sleep)
    original = lk.costed_all_reduce(link, dist, size_of=lambda group: 9)
    try:
        model = cc.make_model(1)
        ddp = DDP(model)
        opt = sgd = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        start, steps, period = 3, 9, 2
        if method == "ddp":
            ddp.register_comm_hook(None, default_hooks.allreduce_hook)
        elif method == "ddp_fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif method == "ddp_powersgd":
            ddp.register_comm_hook(powerSGD_hook.PowerSGDState(None, matrix_approximation_rank=1,
                                                               start_powerSGD_iter=start), powerSGD_hook.powerSGD_hook)
        else:
            ddp.register_comm_hook(post_localSGD_hook.PostLocalSGDState(None, None, start, False),
                                   post_localSGD_hook.post_localSGD_hook)
            opt = PostLocalSGDOptimizer(sgd, averagers.PeriodicModelAverager(period=period, warmup_steps=start))
        g = torch.Generator().manual_seed(0)
        for _ in range(steps):
            opt.zero_grad()
            F.cross_entropy(ddp(torch.randn(8, 1, 28, 28, generator=g)), torch.randint(0, 10, (8,), generator=g)).backward()
            opt.step()
    finally:
        dist.all_reduce = original
    full = cc.model_bytes(model)
    shapes = [tuple(p.shape) for p in model.parameters()]
    ring = lk.ring_bytes(1, 9)
    if method == "ddp":
        want = steps * P.ddp_bytes_per_step("ddp", full, 9)
    elif method == "ddp_fp16":
        want = steps * P.ddp_bytes_per_step("ddp_fp16", full, 9)
    elif method == "ddp_powersgd":
        want = start * ring * full + (steps - start) * P.ddp_bytes_per_step(
            "ddp_powersgd", full, 9, powersgd_bytes=P.powersgd_factor_bytes(shapes, 1))
    else:
        averagings = len([s for s in range(start, steps) if (s - start) % period == 0])
        want = start * ring * full + averagings * P.ddp_bytes_per_step("ddp_localsgd", full, 9, averaging=True)
    st = link.stats()
    assert st["bytes_up"] == pytest.approx(want, abs=steps * 2) and st["bytes_down"] == st["bytes_up"]
    # Every byte was held for at the link's rate (duplex: up and down at once).
    assert sum(c.slept) == pytest.approx(want / 8.14e6, rel=1e-6)


# ------------------------------------------------------------------ run.py's checks

def test_the_protocol_takes_a_frozen_file_only_once_committed_and_unmodified(tmp_path):
    import subprocess
    pytest.importorskip("torch")
    run = _cnn_run()
    repo = tmp_path / "repo"
    repo.mkdir()
    f = repo / "tuned.json"
    f.write_text("{}\n")
    ok, why = run.frozen_is_committed(str(f))
    assert not ok and "not tracked" in why
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["-C", str(repo), "add", "tuned.json"], check=True)
    subprocess.run(git + ["-C", str(repo), "commit", "-qm", "frozen"], check=True)
    ok, commit = run.frozen_is_committed(str(f))
    assert ok and len(commit) == 40
    f.write_text('{"edited": 1}\n')
    ok, why = run.frozen_is_committed(str(f))
    assert not ok and "not committed" in why


def test_the_best_ddp_variant_of_a_frozen_file_is_the_fastest_then_the_most_accurate():
    pytest.importorskip("torch")
    run = _cnn_run()
    chosen = {m: {"median_time_to_target_s": None, "median_final_accuracy": 0.85} for m in P.DDP_METHODS}
    chosen["ddp_localsgd"]["median_final_accuracy"] = 0.87
    assert run.best_ddp_of({"chosen": chosen}) == "ddp_localsgd"
    chosen["ddp_fp16"]["median_time_to_target_s"] = 250.0
    chosen["ddp_powersgd"]["median_time_to_target_s"] = 200.0
    assert run.best_ddp_of({"chosen": chosen}) == "ddp_powersgd"
    assert run.best_ddp_of(None) is None
