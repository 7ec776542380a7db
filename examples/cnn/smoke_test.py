#!/usr/bin/python3
"""ctest examples/cnn_quick: the CNN example at --quick with 2 workers, BSP,
ASHL and plain DDP, 15 s each; passes when every run wrote a JSON line whose
final accuracy (the evaluator's, on all 10,000 test images) is well above
chance (0.1), whose curve has a point per 5 s tick, whose workers put bytes
through the link model in both directions, ASHL's workers went from
profiling to AHL, and the report table has an interval per method; a bad
--ratio is refused by name; the evaluator with --eval-to-target stops at
the first tick that reaches the target and still evaluates the final
parameters. Exit 77 (skipped) when PyTorch, the ashl module
or the data set is missing.

    /usr/bin/python3 examples/cnn/smoke_test.py --out DIR
"""
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "/tmp/ashl-cnn-smoke"
    try:
        import torch  # noqa: F401
    except ImportError:
        print("skipped: PyTorch is not importable by", sys.executable, "(Debian python3-torch)")
        return 77
    try:
        import ashl.torch  # noqa: F401
    except ImportError as e:
        print(f"skipped: the ashl Python module is not importable ({e})")
        return 77
    if not os.path.exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"):
        print("skipped: the data set is not installed (Debian dataset-fashion-mnist)")
        return 77
    bad = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--ratio", "0", "--out", out],
                         capture_output=True, text=True, timeout=60)
    if bad.returncode != 2 or "--ratio = 0.0" not in bad.stderr:
        print(f"run.py --ratio 0: exit {bad.returncode}, stderr {bad.stderr!r}: expected exit 2 naming --ratio")
        return 1
    cmd = [sys.executable, os.path.join(HERE, "run.py"), "--quick", "--methods", "bsp,ashl,ddp", "--budget", "15",
           "--eval-every", "5", "--ratio", "0.3", "--max-attempts", "1", "--out", out]
    r = subprocess.run(cmd, timeout=140)
    if r.returncode != 0:
        print(f"{' '.join(cmd)} exited with {r.returncode}")
        return 1
    with open(os.path.join(out, "results.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    seen = {row["method"]: row for row in rows}
    for m in ("bsp", "ashl", "ddp"):
        if m not in seen:
            print(f"no result line for {m}")
            return 1
        row = seen[m]
        if not row["final_accuracy"] > 0.4 or row["iterations"] < 20:
            print(f"{m}: final accuracy {row['final_accuracy']} after {row['iterations']} iterations: "
                  "a run that trains is well above 0.1")
            return 1
        if row["eval_images"] != 10000 or [t for t, _ in row["curve"]] != [5.0, 10.0, 15.0]:
            print(f"{m}: evaluated on {row['eval_images']} images at {[t for t, _ in row['curve']]}: "
                  "expected all 10,000 at 5, 10, 15 s")
            return 1
        if not 0.0 <= row["foreign_busy"] <= 1.0:
            print(f"{m}: foreign_busy {row['foreign_busy']}: the share of the machine other processes used "
                  "must be in [0, 1]")
            return 1
        if not (row["bytes_up_per_worker"] > 0 and row["bytes_down_per_worker"] > 0):
            print(f"{m}: {row['bytes_up_per_worker']} bytes up, {row['bytes_down_per_worker']} down: "
                  "every method's bytes go through the link model")
            return 1
    with open(os.path.join(out, "table.md")) as f:
        table = f.read()
    for label in ("| BSP |", "| ASHL |", "| DDP (best DDP) |"):
        if label not in table:
            print(f"table.md has no row {label!r}:\n{table}")
            return 1
    if seen["ashl"].get("ratio") != 0.3 or "ratio" in seen["bsp"]:
        print(f"results.jsonl: ashl ratio {seen['ashl'].get('ratio')}, bsp {seen['bsp'].get('ratio')}: "
              "expected 0.3 for ashl (as given) and none for bsp")
        return 1
    for rank in (0, 1):
        with open(os.path.join(out, "runs", "ashl-seed1-a1", f"worker-{rank}.json")) as f:
            stages = [stage for _, stage in json.load(f)["stages"]]
        if stages[:2] != ["profile", "ahl"]:
            print(f"ashl worker {rank}: stages {stages}: expected profiling, then AHL")
            return 1
    # The tuning's evaluator (--eval-to-target) stops at the first tick that
    # reaches the target and still evaluates the final parameters: run it
    # again on a copy of ASHL's run with a target every tick reaches.
    run_copy = os.path.join(out, "eval-to-target")
    shutil.rmtree(run_copy, ignore_errors=True)
    shutil.copytree(os.path.join(out, "runs", "ashl-seed1-a1"), run_copy)
    os.remove(os.path.join(run_copy, "curve.json"))
    ev = subprocess.run([sys.executable, os.path.join(HERE, "run.py"), "--role", "evaluator", "--run-dir", run_copy,
                         "--budget", "15", "--eval-every", "5", "--target", "0.0", "--eval-to-target", "--out", out],
                        capture_output=True, text=True, timeout=120)
    if ev.returncode != 0:
        print(f"evaluator --eval-to-target: exit {ev.returncode}: {ev.stderr[-2000:]}")
        return 1
    with open(os.path.join(run_copy, "curve.json")) as f:
        cut = json.load(f)
    if [t for t, _, _ in cut["curve"]] != [5.0] or not cut["to_target"] or \
            abs(cut["final_accuracy"] - seen["ashl"]["final_accuracy"]) > 2e-4:
        print(f"evaluator --eval-to-target --target 0: curve {cut['curve']}, final {cut['final_accuracy']}: expected "
              f"the 5 s tick only and the run's final accuracy {seen['ashl']['final_accuracy']}")
        return 1
    print("cnn --quick: bsp", seen["bsp"]["final_accuracy"], "ashl", seen["ashl"]["final_accuracy"], "ddp",
          seen["ddp"]["final_accuracy"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
