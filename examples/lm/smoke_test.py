#!/usr/bin/python3
"""ctest examples/lm_quick: the language-model example end to end at
--quick with 2 workers, plain DDP and ASHL, 30 s each; passes when every
run wrote a JSON line whose final validation bits per byte (the
evaluator's, on the fixed held-out slice) is at least MARGIN bits below
the initial model's on the same slice, whose curve has a point per 10 s
tick, whose workers put bytes through the link model in both directions
and counted the tokens they trained on, ASHL's workers went from profiling
to AHL, and the report table has a row per method; the split in the run's
manifest is the rule's (disjoint, every document once, the same as a
second preparation); a DiLoCo-family method is refused by name when the
installed module lacks the diloco policy. Exit 77 (skipped) when PyTorch,
the ashl module or the corpus (Debian python3-doc) is missing.

    /usr/bin/python3 examples/lm/smoke_test.py --out DIR
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MARGIN = 1.0  # bits per byte below the initial model's (about 8: uniform over 256 bytes)


def fail(msg):
    print(msg)
    return 1


def main():
    out = sys.argv[sys.argv.index("--out") + 1] if "--out" in sys.argv else "/tmp/ashl-lm-smoke"
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
    sys.path.insert(0, HERE)
    import lm_common as L
    if not os.path.isdir(L.DATA_DIR):
        print(f"skipped: the corpus {L.DATA_DIR} is not installed (Debian python3-doc)")
        return 77
    run = os.path.join(HERE, "run.py")
    # A DiLoCo-family method: refused by name before anything starts when the module lacks the policy.
    sys.path.insert(1, os.path.join(os.path.dirname(HERE), "common"))
    import harness
    if "diloco" not in harness.installed_policies():
        bad = subprocess.run([sys.executable, run, "--methods", "diloco", "--quick", "--out", out],
                             capture_output=True, text=True, timeout=120)
        if bad.returncode == 0 or "needs the diloco policy" not in bad.stderr:
            return fail(f"run.py --methods diloco: exit {bad.returncode}, stderr {bad.stderr[-600:]!r}: expected a "
                        "refusal naming the diloco policy")
    cmd = [sys.executable, run, "--quick", "--methods", "ddp,ashl", "--budget", "30", "--eval-every", "10",
           "--max-attempts", "1", "--order", "given", "--out", out]
    r = subprocess.run(cmd, timeout=400)
    if r.returncode != 0:
        return fail(f"{' '.join(cmd)} exited with {r.returncode}")
    # The initial model's bits per byte on the same held-out slice.
    data_dir = os.path.join(out, "data")
    data = L.Data(data_dir)
    initial, _ = L.score(L.make_model(1), L.eval_set(data))
    with open(os.path.join(out, "results.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    seen = {row["method"]: row for row in rows}
    for m in ("ddp", "ashl"):
        if m not in seen:
            return fail(f"no result line for {m}")
        row = seen[m]
        if not row["final_bpb"] < initial - MARGIN:
            return fail(f"{m}: final {row['final_bpb']:.3f} bits per byte after {row['iterations']} iterations, the "
                        f"initial model {initial:.3f}: a run that trains is more than {MARGIN} below")
        if [t for t, _ in row["curve"]] != [10.0, 20.0, 30.0]:
            return fail(f"{m}: ticks at {[t for t, _ in row['curve']]}: expected 10, 20, 30 s")
        if row["eval_bytes"] != L.EVAL_SEQS * L.CONTEXT:
            return fail(f"{m}: evaluated on {row['eval_bytes']} bytes: expected {L.EVAL_SEQS} x {L.CONTEXT}")
        if not (row["bytes_up_per_worker"] > 0 and row["bytes_down_per_worker"] > 0):
            return fail(f"{m}: {row['bytes_up_per_worker']} bytes up, {row['bytes_down_per_worker']} down: every "
                        "method's bytes go through the link model")
        if row["tokens"] != row["samples"] * L.CONTEXT or row["samples"] < 20 * L.BATCH:
            return fail(f"{m}: {row['tokens']} tokens from {row['samples']} sequences: expected {L.CONTEXT} a "
                        f"sequence and at least 20 iterations of {L.BATCH}")
    with open(os.path.join(out, "table.md")) as f:
        table = f.read()
    for label in ("| ASHL |", "| DDP (best rival) |", "final validation bits per byte", "tokens per second"):
        if label not in table:
            return fail(f"table.md has no {label!r}:\n{table}")
    for rank in (0, 1):
        with open(os.path.join(out, "runs", "ashl-seed1-a1", f"worker-{rank}.json")) as f:
            stages = [stage for _, stage in json.load(f)["stages"]]
        if stages[:2] != ["profile", "ahl"]:
            return fail(f"ashl worker {rank}: stages {stages}: expected profiling, then AHL")
    # The split the run used is the rule's: disjoint, every document once, reproducible.
    with open(os.path.join(data_dir, "manifest.json")) as f:
        man = json.load(f)
    docs = L.documents(L.DATA_DIR)
    train, valid = L.split(docs)
    if (man["train_documents"], man["valid_documents"]) != (len(train), len(valid)) or set(train) & set(valid) \
            or len(train) + len(valid) != len(docs) or not valid:
        return fail(f"manifest {man}: not the split rule's ({len(train)} + {len(valid)} of {len(docs)})")
    again = L.prepare_data(os.path.join(out, "data-again"), L.DATA_DIR)
    if (again["train_sha256"], again["valid_sha256"]) != (man["train_sha256"], man["valid_sha256"]):
        return fail("a second preparation of the corpus gave other bytes: the split is not deterministic")
    print(f"lm --quick: initial {initial:.3f} bits per byte; ddp {seen['ddp']['final_bpb']:.3f}, "
          f"ashl {seen['ashl']['final_bpb']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
