#!/usr/bin/python3
"""A LeNet-5 on Fashion-MNIST trained by 1 server and 9 heterogeneous worker
processes under ashl's BSP, ADSP, ASHL and ASHL+, and by torch.distributed
DDP (gloo, 127.0.0.1) under the same emulated heterogeneity, one after the
other in one run; test accuracy against wall-clock time as a table, JSON
lines, the curves as text and a PNG plot (gnuplot). docs/cnn.md, docs/perf/cnn.md.

    /usr/bin/python3 examples/cnn/run.py --out cnn-results              # the README's job
    /usr/bin/python3 examples/cnn/run.py --quick --out /tmp/cnn-quick   # 2 workers, 25 s per method

Every method runs the same model, initial parameters, samples (a pure
function of seed, rank and step), learning rate schedule-free SGD with
momentum, compute padding and link rates (cnn_common.py). The processes keep
the parameters as they were at every evaluation tick; this program evaluates
those snapshots after each run (2,000 test images per tick, the 10,000 at
the end), so evaluation takes no CPU from training.
"""
import argparse
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import cnn_common as cc  # noqa: E402

ASHL_METHODS = ("bsp", "adsp", "ashl", "ashl_plus")
ALL_METHODS = ("ddp",) + ASHL_METHODS
LABEL = {"ddp": "DDP (gloo)", "bsp": "BSP", "adsp": "ADSP", "ashl": "ASHL", "ashl_plus": "ASHL+"}


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default=",".join(ALL_METHODS), help="comma-separated, of " + ",".join(ALL_METHODS))
    p.add_argument("--seeds", type=int, default=1, help="seeds per method (default 1)")
    p.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--workers", type=int, default=cc.WORKERS, help="worker processes (default 9: 3 groups of 3)")
    p.add_argument("--budget", type=float, default=150.0, help="wall seconds of training per run (default 150)")
    p.add_argument("--time-scale", type=float, default=5.0, help="K: wall seconds per reference second (default 5)")
    p.add_argument("--eval-every", type=float, default=5.0, help="wall seconds between evaluation ticks (default 5)")
    p.add_argument("--eval-images", type=int, default=2000, help="test images per tick (default 2000; the end: all 10,000)")
    p.add_argument("--target", type=float, default=0.88, help="test accuracy to reach (default 0.88)")
    p.add_argument("--lr", default="0.05", help="SGD learning rate: one value for every method, then optionally "
                   "method=value pairs, e.g. 0.05,ashl=0.07 (default 0.05)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--ratio", type=float, default=0.3,
                   help="ASHL's preset compression ratio r0 (the longest round's top-k share; default 0.3)")
    p.add_argument("--switch-loss", type=float, default=0.5,
                   help="ASHL's switch from AHL to SHL: worker 0's training loss below this (default 0.5)")
    p.add_argument("--quick", action="store_true", help="2 workers, 25 s per run, ddp,bsp,ashl: a smoke test")
    p.add_argument("--out", default="cnn-results")
    p.add_argument("--data-dir", default=cc.DATA_DIR)
    p.add_argument("--role", default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--method", default="", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:  # smaller defaults; flags given explicitly win
        given = " ".join(argv)
        a.workers = a.workers if "--workers" in given else 2
        a.budget = a.budget if "--budget" in given else 25.0
        a.methods = a.methods if "--methods" in given else "ddp,bsp,ashl"
    a.methods = [m for m in a.methods.split(",") if m]
    for m in a.methods:
        if m not in ALL_METHODS:
            p.error(f"--methods: {m!r} is not one of {','.join(ALL_METHODS)}")
    if a.workers < 1:
        p.error(f"--workers = {a.workers}: must be >= 1")
    if not (0 < a.eval_every <= a.budget):
        p.error(f"--eval-every = {a.eval_every}: must be in (0, --budget]")
    a.lr, a.lr_by = parse_lr(p, a.lr)
    if not (a.switch_loss >= 0 and math.isfinite(a.switch_loss)):
        p.error(f"--switch-loss = {a.switch_loss}: must be a finite number >= 0")
    if not (0 < a.ratio <= 1):
        p.error(f"--ratio = {a.ratio}: must be in (0, 1]")
    # The processes of a run start in this directory: they get the output directory as an absolute path.
    a.out = os.path.abspath(a.out)
    a.data_dir_npy = os.path.join(a.out, "data")
    return a


def parse_lr(p, text):
    """--lr "0.05" or "0.05,ashl=0.07": the default rate and the per-method ones."""
    def rate(v, what):
        try:
            r = float(v)
        except ValueError:
            r = math.nan
        if not (r > 0 and math.isfinite(r)):
            p.error(f"--lr: {what} = {v!r} must be a positive number")
        return r
    lr, by = 0.05, {}
    for part in (x for x in text.split(",") if x):
        if "=" in part:
            m, v = part.split("=", 1)
            if m not in ALL_METHODS:
                p.error(f"--lr: {m!r} is not one of {','.join(ALL_METHODS)}")
            by[m] = rate(v, m)
        else:
            lr = rate(part, "the default")
    return lr, by


def lr_for(a, method):
    return a.lr_by.get(method, a.lr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_args(a, role, rank, method, seed, run_dir, port):
    return [sys.executable, os.path.abspath(__file__), "--role", role, "--rank", str(rank), "--method", method,
            "--seed", str(seed), "--run-dir", run_dir, "--port", str(port), "--workers", str(a.workers),
            "--budget", repr(a.budget), "--time-scale", repr(a.time_scale), "--eval-every", repr(a.eval_every),
            "--lr", repr(lr_for(a, method)), "--momentum", repr(a.momentum), "--ratio", repr(a.ratio),
            "--switch-loss", repr(a.switch_loss), "--out", a.out]


def cpu_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def run_one(a, method, seed):
    """Start the processes of one run, the start instant once all are ready, wait for them."""
    run_dir = os.path.join(os.path.abspath(a.out), "runs", f"{method}-seed{seed}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    port = free_port()
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", ASHL_TOKEN=os.urandom(16).hex())
    env.setdefault("UCX_NET_DEVICES", "lo")
    # The processes start in this directory, where a relative PYTHONPATH entry names another place.
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(e) if e else e for e in env["PYTHONPATH"].split(os.pathsep))
    if method == "ddp":
        roles = [("ddp", r) for r in range(a.workers)]
    else:
        roles = [("server", 0)] + [("worker", r) for r in range(a.workers)]
    for role, rank in roles:
        log = open(os.path.join(run_dir, f"{role}-{rank}.log"), "w")
        procs.append(subprocess.Popen(child_args(a, role, rank, method, seed, run_dir, port), stdout=log,
                                      stderr=subprocess.STDOUT, env=env, cwd=HERE))
    t_launch = time.time()
    deadline = cc.mono() + 180.0
    ready = lambda: all(os.path.exists(f"{run_dir}/ready-{r}") for r in range(a.workers))
    while not ready():
        if cc.mono() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            raise SystemExit(f"{method} seed {seed}: the processes did not all start; logs in {run_dir}")
        time.sleep(0.05)
    t_ready = time.time()
    t0 = cc.mono() + 0.5
    cc.write_file(f"{run_dir}/start", repr(t0) + "\n")
    load0, busy0 = os.getloadavg()[0], cpu_busy()
    step = 30.0 if a.budget > 60 else a.budget
    for k in range(1, int(a.budget // step) + 1):  # progress lines
        cc.sleep_until(t0 + k * step)
        if k * step < a.budget:
            alive = sum(p.poll() is None for p in procs)
            print(f"  {LABEL[method]} seed {seed}: {k * step:.0f}/{a.budget:g} s, {alive}/{len(procs)} processes, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    cc.sleep_until(t0 + a.budget)
    load1 = os.getloadavg()[0]
    busy1 = cpu_busy()
    grace = cc.mono() + 60.0
    while any(p.poll() is None for p in procs) and cc.mono() < grace:
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    bad = [(role, rank, p.returncode) for (role, rank), p in zip(roles, procs) if p.returncode != 0]
    if bad:
        raise SystemExit(f"{method} seed {seed}: {bad} failed; logs in {run_dir}")
    busy = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    return run_dir, {"load_start": load0, "load_end": load1, "machine_busy": round(busy, 3),
                     "launch_to_start_s": round(t_ready - t_launch, 2)}


def evaluate_run(a, method, seed, run_dir, data):
    import torch
    torch.set_num_threads(min(2, os.cpu_count() or 1))  # nothing else of this run is left to compete with
    snap = torch.load(f"{run_dir}/snapshots.pt")
    model = cc.make_model(seed)
    xs, ys = data.test_set(a.eval_images)
    xa, ya = data.test_set(len(data.test_y))

    def load(flat):
        torch.nn.utils.vector_to_parameters(flat, model.parameters())

    curve = []
    for t, flat in zip(snap["ticks"], snap["params"]):
        load(flat)
        acc, loss = cc.evaluate(model, xs, ys)
        curve.append((round(t, 3), acc, loss))
    load(snap["final"])
    final_acc, final_loss = cc.evaluate(model, xa, ya)
    return curve, final_acc, final_loss


def worker_stats(a, run_dir):
    out = []
    for r in range(a.workers):
        with open(f"{run_dir}/worker-{r}.json") as f:
            out.append(json.load(f))
    return out


def time_to_target(curve, target):
    for t, acc, _ in curve:
        if acc >= target:
            return t
    return math.nan


def json_line(obj):
    """One strict JSON object (NaN, e.g. a target not reached, as null)."""
    clean = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in obj.items()}
    return json.dumps(clean, allow_nan=False) + "\n"


def median(v):
    v = sorted(x for x in v if not math.isnan(x))
    if not v:
        return math.nan
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def fmt(x, spec=".1f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def plot(a, curves):
    """accuracy_vs_time.png with gnuplot (Debian gnuplot-nox); skipped with a note when it is missing."""
    if not shutil.which("gnuplot"):
        print("note: gnuplot not found (apt-get install gnuplot-nox); no PNG written", flush=True)
        return None
    out = os.path.abspath(a.out)
    files = []
    for (method, seed), curve in curves.items():
        path = f"{out}/curve_{method}_seed{seed}.dat"
        with open(path, "w") as f:
            for t, acc, _ in curve:
                f.write(f"{t} {acc}\n")
        files.append((method, seed, path))
    lines = ['set terminal pngcairo size 1000,600' if "pngcairo" in terminals() else "set terminal png size 1000,600",
             f'set output "{out}/accuracy_vs_time.png"',
             f'set title "LeNet-5 on Fashion-MNIST, {a.workers} heterogeneous workers (K = {a.time_scale:g})"',
             'set xlabel "wall-clock seconds"', 'set ylabel "test accuracy (2,000 images)"', "set key bottom right",
             "set grid", "set yrange [0.5:0.95]",
             f'set arrow from graph 0, first {a.target} to graph 1, first {a.target} nohead dt 2']
    styles = {"ddp": 1, "bsp": 2, "adsp": 3, "ashl": 4, "ashl_plus": 5}
    plots = [f'"{path}" using 1:2 with lines lw 2 lc {styles[m]} title "{LABEL[m]}' + (f' seed {s}"' if a.seeds > 1 else '"')
             for m, s, path in files]
    lines.append("plot " + ", ".join(plots))
    script = f"{out}/accuracy_vs_time.gp"
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"note: gnuplot failed: {r.stderr.strip()}", flush=True)
        return None
    return f"{out}/accuracy_vs_time.png"


def terminals():
    r = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return r.stdout + r.stderr


def orchestrate(a):
    import torch
    torch.set_num_threads(1)
    t_all = time.time()
    os.makedirs(a.out, exist_ok=True)
    cc.prepare_data(a.data_dir_npy, a.data_dir)
    data = cc.Data(a.data_dir_npy)
    if any(m != "ddp" for m in a.methods):
        try:
            import ashl.torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"the ashl Python module is not importable ({e}); `pip install .` in the repository, "
                             "or run only --methods ddp")
    print(f"# LeNet-5 ({sum(p.numel() for p in cc.make_model(1).parameters())} parameters), {a.workers} workers, "
          f"K = {a.time_scale:g}, budget {a.budget:g} s per run, target {a.target}, lr {','.join([f'{a.lr:g}'] + [f'{m}={v:g}' for m, v in a.lr_by.items()])}, "
          f"methods {','.join(a.methods)}, seeds {a.first_seed}..{a.first_seed + a.seeds - 1}; load average {os.getloadavg()[0]:.2f}", flush=True)
    results, curves = [], {}
    jsonl = open(os.path.join(a.out, "results.jsonl"), "w")
    for seed in range(a.first_seed, a.first_seed + a.seeds):
        for method in a.methods:
            t_run = time.time()
            run_dir, machine = run_one(a, method, seed)
            curve, final_acc, final_loss = evaluate_run(a, method, seed, run_dir, data)
            ws = worker_stats(a, run_dir)
            curves[(method, seed)] = curve
            steps = sum(w["steps"] for w in ws)
            rec = {"method": method, "seed": seed, "target_accuracy": a.target,
                   "time_to_target_s": time_to_target(curve, a.target), "final_accuracy": final_acc,
                   "final_loss": final_loss, "lr": lr_for(a, method),
                   **({"ratio": a.ratio, "switch_loss": a.switch_loss} if method in ("ashl", "ashl_plus") else {}),
                   "budget_s": a.budget, "time_scale": a.time_scale, "workers": a.workers,
                   "iterations": steps, "samples": sum(w["samples"] for w in ws),
                   "iterations_per_group": [sum(w["steps"] for w in ws if cc.group_of(w["rank"], a.workers) == g)
                                            for g in range(3)],
                   "bytes_sent_per_worker": sum(w["bytes_sent"] for w in ws) / len(ws),
                   "overrun_fraction": sum(w["overruns"] for w in ws) / max(1, steps),
                   "cpu_seconds": sum(w["cpu_seconds"] for w in ws), "run_wall_s": round(time.time() - t_run, 1),
                   "curve": [[t, round(acc, 4)] for t, acc, _ in curve], **machine}
            results.append(rec)
            jsonl.write(json_line(rec))
            jsonl.flush()
            print(f"{LABEL[method]:<11} seed {seed}: target at {fmt(rec['time_to_target_s'])} s, final accuracy "
                  f"{final_acc:.4f}, {steps} iterations, {rec['bytes_sent_per_worker'] / 1e6:.1f} MB sent per worker, "
                  f"overruns {rec['overrun_fraction']:.1%}, load {machine['load_start']:.1f}-{machine['load_end']:.1f}, "
                  f"{rec['run_wall_s']:.0f} s", flush=True)
    jsonl.close()
    table(a, results)
    png = plot(a, curves)
    if png:
        print(f"plot: {png}")
    print(f"# total {time.time() - t_all:.0f} s", flush=True)
    return 0


def table(a, results):
    by = {}
    for r in results:
        by.setdefault(r["method"], []).append(r)
    ddp_t = median([r["time_to_target_s"] for r in by.get("ddp", [])])
    ddp_acc = median([r["final_accuracy"] for r in by.get("ddp", [])])
    lines = [f"\nmethod       time to {a.target:.2f} (s, median)   x DDP   final accuracy   vs DDP (points)   "
             f"iterations   MB/worker   overruns",
             "-" * 116]
    summary = []
    for m in a.methods:
        rs = by.get(m, [])
        if not rs:
            continue
        t = median([r["time_to_target_s"] for r in rs])
        acc = median([r["final_accuracy"] for r in rs])
        ratio = t / ddp_t if not math.isnan(ddp_t) and ddp_t > 0 else math.nan
        # DDP ran but did not reach the target: the ratio is below t / budget.
        below = t / a.budget if math.isnan(ddp_t) and "ddp" in by and m != "ddp" and not math.isnan(t) else math.nan
        shown = fmt(ratio, ".2f") if math.isnan(below) else "<" + fmt(below, ".2f")
        lines.append(f"{LABEL[m]:<12} {fmt(t):>26}   {shown:>5}   {acc:>14.4f}   "
                     f"{fmt(100 * (acc - ddp_acc) if not math.isnan(ddp_acc) else math.nan, '+.2f'):>15}   "
                     f"{median([r['iterations'] for r in rs]):>10.0f}   "
                     f"{median([r['bytes_sent_per_worker'] for r in rs]) / 1e6:>9.1f}   "
                     f"{median([r['overrun_fraction'] for r in rs]):>8.1%}")
        summary.append({"method": m, "seeds": len(rs), "median_time_to_target_s": t, "ratio_to_ddp": ratio,
                        "ratio_to_ddp_below": below,
                        "median_final_accuracy": acc, "final_accuracy_vs_ddp_points":
                        100 * (acc - ddp_acc) if not math.isnan(ddp_acc) else math.nan})
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    with open(os.path.join(a.out, "table.txt"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.jsonl"), "w") as f:
        for s in summary:
            f.write(json_line(s))


def main(argv):
    a = parse(argv)
    if a.role == "orchestrator":
        return orchestrate(a)
    a.data_dir = a.data_dir_npy
    if a.role == "ddp":
        import ddp_worker
        return ddp_worker.main(a)
    import ashl_worker
    return ashl_worker.main(a)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
