"""The harness of the examples' comparisons (examples/cnn, examples/lm): one
run of a method is a set of real processes on this machine (the DDP ranks,
or an ashl server and its workers) under one emulation of heterogeneity
(compute padding per speed group, link.py's link model), and a separate
evaluator process (evaluator.py) that scores the method's model at each
tick; around the runs, the protocol (protocol.py): a tuning grid with the
same budget for every method on held-out seeds, a frozen file committed
before any test seed runs, a random method order per seed, flagged
overruns repeated, bootstrap intervals, the report. docs/cnn.md, docs/lm.md.

An example gives a Workload (what is trained and how it is scored) and
calls main:

    W = harness.Workload(name="cnn", here=HERE, common=cnn_common, metric=protocol.ACCURACY, ...)
    sys.exit(harness.main(sys.argv[1:], W))

The same script is the orchestrator and, started again with --role, each
process of a run (ddp_worker.py, ashl_worker.py, evaluator.py, which call
the workload's hooks: model, batches, loss, inner optimizer, evaluation).
"""
import argparse
import faulthandler
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

import protocol  # noqa: E402

LABEL = protocol.LABEL
TUNING_SEEDS = (101, 102)
TEST_SEEDS = (1, 2, 3, 4, 5)


class Workload:
    """What an example gives the harness. name: its folder under examples/
    and its output's name; here: that folder (grid.json, tuned.json,
    protocol-runs/); script: the run.py the processes of a run start; doc:
    the usage text of --help; common: the module with the workload's hooks
    (DATA_DIR, WORKERS, LINK_FACTOR, REFERENCE_MODEL_BYTES,
    REFERENCE_COMM_S, EVAL_TEXT, prepare_data, group_of, mono, sleep_until,
    write_file, and for the processes of a run those ddp_worker.py,
    ashl_worker.py and evaluator.py name); methods: those --methods
    accepts; runnable: the default --methods; metric: protocol.ACCURACY or
    BITS_PER_BYTE; rivals: the methods "best_ddp" is chosen among and
    rival_name what the report calls it; default_config: each method's
    configuration before a frozen file; defaults: the argument defaults
    that differ (budget, target, ...); quick: --quick's methods; title: the
    report's and plot's name of the job; tokens_per_sample: > 1 counts
    tokens (the language model); eval_unit: what the evaluator counts
    (images, bytes); adsp_target_loss, switch_loss: ADSP's target loss and
    ASHL's default switch loss, in the workload's training loss."""

    def __init__(self, name, here, script, doc, common, methods, runnable, metric, rivals, rival_name, default_config,
                 defaults, quick, title, plot_yrange, eval_unit, tokens_per_sample=1, adsp_target_loss=0.4,
                 switch_loss=0.5):
        self.name, self.here, self.script, self.doc, self.common = name, here, script, doc, common
        self.methods, self.runnable, self.metric = tuple(methods), tuple(runnable), metric
        self.rivals, self.rival_name = tuple(rivals), rival_name
        self.default_config, self.defaults, self.quick = dict(default_config), dict(defaults), quick
        self.title, self.plot_yrange, self.eval_unit = title, plot_yrange, eval_unit
        self.tokens_per_sample, self.adsp_target_loss, self.switch_loss = tokens_per_sample, adsp_target_loss, switch_loss
        self.grid = os.path.join(here, "grid.json")
        self.frozen = os.path.join(here, "tuned.json")
        self.summary = os.path.join(here, "protocol-runs", "summary.json")
        self.rel = os.path.join("examples", name)


def parse(argv, W):
    cc = W.common
    d = dict(budget=300.0, time_scale=5.0, eval_every=2.5, target=0.88, momentum=0.9, quick_budget=25.0)
    d.update(W.defaults)
    ALL_METHODS, DEFAULT_CONFIG = W.methods, W.default_config
    p = argparse.ArgumentParser(description=W.doc.split("\n\n")[0], epilog="\n\n".join(W.doc.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="", help="comma-separated, of " + ",".join(ALL_METHODS) +
                   f" (default: {','.join(W.runnable)}; 'best_ddp': {W.rival_name}, the fastest on the committed "
                   "protocol's test seeds, or before those the frozen tuning's)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per method (default 1)")
    p.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--seed-list", default="", help="the seeds, comma-separated (instead of --seeds/--first-seed)")
    p.add_argument("--workers", type=int, default=cc.WORKERS, help="worker processes (default 9: 3 groups of 3)")
    p.add_argument("--budget", type=float, default=d["budget"], help=f"wall seconds of training per run (default {d['budget']:g})")
    p.add_argument("--time-scale", type=float, default=d["time_scale"],
                   help=f"K: wall seconds per reference second (default {d['time_scale']:g})")
    p.add_argument("--eval-every", type=float, default=d["eval_every"],
                   help=f"wall seconds between evaluation ticks (default {d['eval_every']:g})")
    p.add_argument("--target", type=float, default=d["target"], help=f"{W.metric.label} to reach (default {d['target']:g})")
    p.add_argument("--momentum", type=float, default=d["momentum"])
    p.add_argument("--config", dest="config_file", default=W.frozen,
                   help=f"the frozen tuning file (default {W.rel}/tuned.json)")
    p.add_argument("--set", action="append", default=[], metavar="METHOD.KEY=VALUE",
                   help="override one configuration value, e.g. ashl.ratio=0.1 or all.lr=0.07 (ad hoc runs only)")
    p.add_argument("--lr", default="", help="shorthand: 0.05 or 0.05,ashl=0.07 (as --set all.lr=..., METHOD.lr=...)")
    p.add_argument("--ratio", type=float, default=None, help="shorthand: ASHL's and ASHL+'s r0 (as --set)")
    p.add_argument("--switch-loss", type=float, default=W.switch_loss,
                   help=f"ASHL's switch from AHL to SHL: worker 0's training loss below this (default {W.switch_loss:g})")
    p.add_argument("--server-link-factor", type=float, default=cc.LINK_FACTOR[0],
                   help="f_m of the ashl server's link (default 4: the fastest group's), shared by all its workers")
    p.add_argument("--eval-cpus", default="", help="CPUs for a concurrent evaluator, taken from the training "
                   "(e.g. 2,3); default: none, the evaluator waits for the run's end")
    p.add_argument("--eval-to-target", action="store_true",
                   help="evaluate the ticks only up to the first that reaches --target, then the final parameters "
                   "(the default of --tune, whose rows need only the time to target and the final accuracy)")
    p.add_argument("--max-attempts", type=int, default=3,
                   help="runs of one (method, seed) while more than 2 %% of its iterations overran (default 3)")
    p.add_argument("--order", choices=("random", "given"), default="random",
                   help="methods per seed in a random order (default) or as given")
    p.add_argument("--tune", action="store_true", help="run the tuning grid on the tuning seeds")
    p.add_argument("--tuning-seeds", default=",".join(map(str, TUNING_SEEDS)))
    p.add_argument("--grid", default=W.grid)
    p.add_argument("--freeze", default="", metavar="FILE", help="write the frozen file from --out's tuning.jsonl")
    p.add_argument("--tuning-status", default="", metavar="DIR",
                   help="print how far the tuning in DIR/tuning.jsonl is, and its runs as a markdown table")
    p.add_argument("--update-doc", default="", metavar="FILE",
                   help="with --tuning-status: write that table into FILE between its tuning-status markers "
                        f"(docs/perf/{W.name}.md) instead of printing it")
    p.add_argument("--protocol", action="store_true",
                   help="the test seeds (1-5), all methods, under the committed frozen file; writes table.md")
    p.add_argument("--report", default="", metavar="DIR",
                   help="the table from DIR/results.jsonl (with --target: at that score, from the curves)")
    p.add_argument("--max-runs", type=int, default=0, metavar="N",
                   help="--tune, --protocol: stop after N (method, seed) runs; run again to go on (default: all)")
    p.add_argument("--boot", type=int, default=10000, help="bootstrap resamples (default 10000)")
    p.add_argument("--quick", action="store_true",
                   help=f"2 workers, {d['quick_budget']:g} s per run, {W.quick}: a smoke test")
    p.add_argument("--out", default=f"{W.name}-results")
    p.add_argument("--data-dir", default=cc.DATA_DIR)
    p.add_argument("--role", default="orchestrator", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--method", default="", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--run-dir", default="", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--config-json", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    given = " ".join(argv)
    a.target_given = "--target" in given
    if a.quick:  # smaller defaults; flags given explicitly win
        a.workers = a.workers if "--workers" in given else 2
        a.budget = a.budget if "--budget" in given else d["quick_budget"]
        if "--max-attempts" not in given and "quick_max_attempts" in d:  # a smoke run reports a flag, not repeats
            a.max_attempts = d["quick_max_attempts"]
        a.methods = a.methods or ("" if a.protocol or a.tune or a.freeze else W.quick)
    if a.protocol:
        if a.methods or a.set or a.lr or a.ratio is not None:
            p.error("--protocol runs every method under the frozen file: no --methods, --set, --lr or --ratio")
        if "--seed-list" not in given and "--seeds" not in given and "--first-seed" not in given:
            a.seed_list = ",".join(map(str, TEST_SEEDS))
    a.methods = [m for m in (a.methods or ",".join(W.runnable)).split(",") if m]
    for m in a.methods:
        if m not in ALL_METHODS and m != "best_ddp":
            p.error(f"--methods: {m!r} is not one of {','.join(ALL_METHODS)} or best_ddp")
    if a.workers < 1:
        p.error(f"--workers = {a.workers}: must be >= 1")
    if not (0 < a.eval_every <= a.budget):
        p.error(f"--eval-every = {a.eval_every}: must be in (0, --budget]")
    if not (a.switch_loss >= 0 and math.isfinite(a.switch_loss)):
        p.error(f"--switch-loss = {a.switch_loss}: must be a finite number >= 0")
    if a.ratio is not None and not (0 < a.ratio <= 1):
        p.error(f"--ratio = {a.ratio}: must be in (0, 1]")
    if not (a.server_link_factor > 0 and math.isfinite(a.server_link_factor)):
        p.error(f"--server-link-factor = {a.server_link_factor}: must be > 0")
    if a.max_attempts < 1:
        p.error(f"--max-attempts = {a.max_attempts}: must be >= 1")
    try:
        a.seed_values = ([int(s) for s in a.seed_list.split(",") if s] if a.seed_list else
                         list(range(a.first_seed, a.first_seed + a.seeds)))
        a.tuning_seed_values = [int(s) for s in a.tuning_seeds.split(",") if s]
        a.eval_cpus = [int(c) for c in a.eval_cpus.split(",") if c] if isinstance(a.eval_cpus, str) else a.eval_cpus
    except ValueError as e:
        p.error(f"a seed or CPU list: {e}")
    a.W = W
    a.overrides = parse_overrides(p, a)
    a.config = json.loads(a.config_json)
    # The processes of a run start in this directory: they get the output directory as an absolute path.
    a.out = os.path.abspath(a.out)
    a.data_dir_npy = os.path.join(a.out, "data")
    a.server_rate = cc.REFERENCE_MODEL_BYTES / (a.server_link_factor * cc.REFERENCE_COMM_S * a.time_scale)
    return a


def parse_overrides(p, a):
    """{method or "all": {key: value}} from --set, --lr and --ratio."""
    ALL_METHODS, DEFAULT_CONFIG = a.W.methods, a.W.default_config
    out = {}

    def put(m, k, v):
        if m != "all" and m not in ALL_METHODS:
            p.error(f"--set: {m!r} is not 'all' or one of {','.join(ALL_METHODS)}")
        if k not in DEFAULT_CONFIG:
            p.error(f"--set: {k!r} is not one of {','.join(DEFAULT_CONFIG)}")
        try:
            x = float(v)
        except ValueError:
            x = math.nan
        if not (math.isfinite(x) and x >= 0) or (k in ("lr", "ratio") and not x > 0):
            p.error(f"--set {m}.{k} = {v!r}: must be a number > 0 (>= 0 for warmup_s)")
        out.setdefault(m, {})[k] = x

    for s in a.set:
        if "=" not in s or "." not in s.split("=", 1)[0]:
            p.error(f"--set {s!r}: must be METHOD.KEY=VALUE")
        lhs, v = s.split("=", 1)
        m, k = lhs.split(".", 1)
        put(m, k, v)
    for part in (x for x in a.lr.split(",") if x):
        if "=" in part:
            m, v = part.split("=", 1)
            put(m, "lr", v)
        else:
            put("all", "lr", part)
    if a.ratio is not None:
        put("ashl", "ratio", a.ratio)
        put("ashl_plus", "ratio", a.ratio)
    return out


# ------------------------------------------------------------------ configuration

def load_frozen(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def frozen_is_committed(path):
    """(True, commit) when path is tracked by git and unmodified; else (False, why)."""
    d = os.path.dirname(os.path.abspath(path))
    try:
        subprocess.run(["git", "ls-files", "--error-unmatch", path], cwd=d, check=True, capture_output=True)
        if subprocess.run(["git", "diff", "--quiet", "HEAD", "--", path], cwd=d).returncode != 0:
            return False, f"{path} has changes not committed"
        head = subprocess.run(["git", "log", "-1", "--format=%H", "--", path], cwd=d, check=True,
                              capture_output=True, text=True).stdout.strip()
        return True, head
    except (subprocess.CalledProcessError, FileNotFoundError):
        return False, f"{path} is not tracked by git"


def config_for(a, method, frozen):
    cfg = dict(a.W.default_config)
    # A method the frozen file has no entry for (the DiLoCo family, not in
    # the tuning yet) runs the defaults; the run's header says so.
    if frozen is not None and method in frozen["chosen"]:
        cfg.update(frozen["chosen"][method]["config"])
    cfg.update(a.overrides.get("all", {}))
    cfg.update(a.overrides.get(method, {}))
    return cfg


def best_ddp_of(frozen, rivals=protocol.DDP_METHODS, metric=protocol.ACCURACY):
    """The rival (a DDP variant for the CNN) with the lowest median tuning time (the frozen file's), or None."""
    if frozen is None:
        return None
    ddps = [m for m in rivals if m in frozen["chosen"]]
    inf = math.inf
    c = frozen["chosen"]
    # The fastest to the target on the tuning seeds; among variants that did not reach it, the best final score.
    t = lambda m: inf if c[m]["median_time_to_target_s"] is None else c[m]["median_time_to_target_s"]
    return min(ddps, key=lambda m: (t(m), metric.rank(c[m][f"median_{metric.final_key}"]), m)) if ddps else None


def strongest_ddp(frozen, W):
    """What --methods best_ddp runs, and why: the rival fastest on the
    committed protocol's test seeds when its summary is there (the strongest
    rival those runs found), else the frozen tuning's fastest, else the
    workload's stand-in (the CNN's ddp_fp16)."""
    if os.path.exists(W.summary):
        with open(W.summary) as f:
            b = protocol.load_summary(f.read()).get("best_ddp")
        if b:
            return b, f"the fastest on the protocol's test seeds ({W.rel}/protocol-runs/summary.json)"
    b = best_ddp_of(frozen, W.rivals, W.metric)
    if b:
        return b, f"the frozen tuning's fastest ({W.rel}/tuned.json)"
    stand_in = W.defaults.get("best_ddp_stand_in", "ddp_fp16")
    return stand_in, f"no frozen tuning file or protocol summary: {stand_in} stands in"


def resolve_methods(a, frozen):
    out = []
    for m in a.methods:
        if m == "best_ddp":
            m, why = strongest_ddp(frozen, a.W)
            print(f"{a.W.rival_name}: {LABEL[m]}, {why}", flush=True)
        if m not in out:
            out.append(m)
    return out


# ------------------------------------------------------------------ one run

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_args(a, role, rank, method, seed, run_dir, port, cfg):
    return [sys.executable, a.W.script, "--role", role, "--rank", str(rank), "--method", method,
            "--seed", str(seed), "--run-dir", run_dir, "--port", str(port), "--workers", str(a.workers),
            "--budget", repr(a.budget), "--time-scale", repr(a.time_scale), "--eval-every", repr(a.eval_every),
            "--momentum", repr(a.momentum), "--switch-loss", repr(a.switch_loss),
            "--server-link-factor", repr(a.server_link_factor), "--config-json", json.dumps(cfg),
            "--eval-cpus", ",".join(map(str, a.eval_cpus)), "--out", a.out, "--target", repr(a.target)] + \
        (["--eval-to-target"] if a.eval_to_target else [])


def log_tail(path, lines=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError as e:
        return f"(no log: {e})"


def cpu_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return sum(v) - v[3] - v[4], sum(v)


def cpu_ticks(pids):
    """CPU time (user + system, clock ticks as in /proc/stat) the processes
    used so far; a process already gone counts 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of the line)
        except (OSError, IndexError, ValueError):
            pass
    return total


def run_one(a, method, seed, cfg, tag):
    """Start the processes of one run and its evaluator, the start instant
    once all are ready; wait for the training, then for the evaluator."""
    cc = a.W.common
    run_dir = os.path.join(a.out, "runs", tag)
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    port = free_port()
    procs = []
    env = dict(os.environ, OMP_NUM_THREADS="1", ASHL_TOKEN=os.urandom(16).hex())
    env.update(getattr(cc, "child_env", lambda: {})())  # the workload's (the language model's BLAS)
    env.setdefault("UCX_NET_DEVICES", "lo")
    # The processes start in this directory, where a relative PYTHONPATH entry names another place.
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(e) if e else e for e in env["PYTHONPATH"].split(os.pathsep))
    if method.startswith("ddp"):
        roles = [("ddp", r) for r in range(a.workers)]
    else:
        import link
        link.ServerPort.create(f"{run_dir}/server-link", a.server_rate).close()
        roles = [("server", 0)] + [("worker", r) for r in range(a.workers)]
    roles.append(("evaluator", 0))
    all_cpus = sorted(os.sched_getaffinity(0))
    train_cpus = [c for c in all_cpus if c not in a.eval_cpus] or all_cpus
    for role, rank in roles:
        log = open(os.path.join(run_dir, f"{role}-{rank}.log"), "w")
        cpus = train_cpus if role != "evaluator" or not a.eval_cpus else a.eval_cpus
        procs.append(subprocess.Popen(child_args(a, role, rank, method, seed, run_dir, port, cfg), stdout=log,
                                      stderr=subprocess.STDOUT, env=env, cwd=a.W.here,
                                      preexec_fn=lambda c=cpus: os.sched_setaffinity(0, c)))
    training, evaluator = procs[:-1], procs[-1]
    t_launch = time.time()
    deadline = cc.mono() + 180.0
    names = [f"ready-{r}" for r in range(a.workers)] + ["ready-evaluator"]
    while not all(os.path.exists(f"{run_dir}/{n}") for n in names):
        if cc.mono() > deadline or any(p.poll() not in (None, 0) for p in procs):
            for p in procs:
                p.kill()
            raise SystemExit(f"{method} seed {seed}: the processes did not all start; logs in {run_dir}")
        time.sleep(0.05)
    t_ready = time.time()
    t0 = cc.mono() + 0.5
    cc.write_file(f"{run_dir}/start", repr(t0) + "\n")
    pids = [p.pid for p in procs] + [os.getpid()]
    load0, busy0, own0 = os.getloadavg()[0], cpu_busy(), cpu_ticks(pids)
    step = 30.0 if a.budget > 60 else a.budget
    for k in range(1, int(a.budget // step) + 1):  # progress lines
        cc.sleep_until(t0 + k * step)
        if k * step < a.budget:
            alive = sum(p.poll() is None for p in training)
            print(f"  {LABEL[method]} seed {seed}: {k * step:.0f}/{a.budget:g} s, {alive}/{len(training)} processes, "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    cc.sleep_until(t0 + a.budget)
    load1, busy1, own1 = os.getloadavg()[0], cpu_busy(), cpu_ticks(pids)
    grace = cc.mono() + 60.0
    while any(p.poll() is None for p in training) and cc.mono() < grace:
        time.sleep(0.05)
    stuck = [p for p in training if p.poll() is None]
    for p in stuck:
        p.send_signal(signal.SIGUSR1)  # where it is stuck, into its log (faulthandler)
    if stuck:
        time.sleep(1.0)
    for p in stuck:
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            p.wait()
    cc.write_file(f"{run_dir}/done", "1\n")
    t_eval = time.time()
    try:
        evaluator.wait(timeout=600 + 10 * a.budget / a.eval_every)
    except subprocess.TimeoutExpired:
        evaluator.kill()
        evaluator.wait()
    bad = [(role, rank, p.returncode) for (role, rank), p in zip(roles, procs) if p.returncode != 0]
    if bad:
        for role, rank, rc in bad:  # the end of each failed process's log, so that a CI log says why
            print(f"--- {role} {rank} (exit {rc}): the end of {run_dir}/{role}-{rank}.log", flush=True)
            print(log_tail(f"{run_dir}/{role}-{rank}.log"), flush=True)
        raise SystemExit(f"{method} seed {seed}: {bad} failed; logs in {run_dir}")
    busy = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1])
    # What the machine was busy with beyond this run's processes (and this
    # one), as a share of all its CPU time: another job's load.
    foreign = max(0.0, (busy1[0] - busy0[0]) - (own1 - own0)) / max(1, busy1[1] - busy0[1])
    return run_dir, {"started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t_ready)),
                     "load_start": load0, "load_end": load1, "machine_busy": round(busy, 3),
                     "foreign_busy": round(foreign, 3),
                     "launch_to_start_s": round(t_ready - t_launch, 2), "evaluation_s": round(time.time() - t_eval, 1)}


def worker_stats(a, run_dir):
    out = []
    for r in range(a.workers):
        with open(f"{run_dir}/worker-{r}.json") as f:
            out.append(json.load(f))
    return out


def run_row(a, method, seed, cfg, tag, extra):
    """One run, evaluated: the row of results.jsonl."""
    cc, M = a.W.common, a.W.metric
    t_run = time.time()
    run_dir, machine = run_one(a, method, seed, cfg, tag)
    with open(f"{run_dir}/curve.json") as f:
        ev = json.load(f)
    ws = worker_stats(a, run_dir)
    steps = sum(w["steps"] for w in ws)
    overruns = sum(w["overruns"] for w in ws)
    slow = max(cc.group_of(w["rank"], a.workers) for w in ws)
    slowest = [w for w in ws if cc.group_of(w["rank"], a.workers) == slow and w["steps"] > 0]
    measured = protocol.median_of([1e3 * w["wall_seconds"] / w["steps"] for w in slowest])
    emulated = protocol.median_of([1e3 * (w["pad_seconds"] + w["link_seconds"]) / w["steps"] for w in slowest])
    row = {"method": method, "seed": seed, "config": cfg, M.target_key: a.target,
           "time_to_target_s": protocol.first_reached(ev["curve"], a.target, M), M.final_key: ev[M.final_key],
           "final_loss": ev["final_loss"], f"eval_{a.W.eval_unit}": ev[a.W.eval_unit], "eval_mode": ev["mode"],
           "budget_s": a.budget, "time_scale": a.time_scale, "workers": a.workers,
           "server_link_factor": a.server_link_factor if not method.startswith("ddp") else None,
           "iterations": steps, "overruns": overruns, "overrun_fraction": protocol.overrun_fraction(overruns, steps),
           "samples": sum(w["samples"] for w in ws),
           **({"tokens": sum(w["samples"] for w in ws) * a.W.tokens_per_sample} if a.W.tokens_per_sample > 1 else {}),
           "iterations_per_group": [sum(w["steps"] for w in ws if cc.group_of(w["rank"], a.workers) == g)
                                    for g in range(3)],
           "bytes_up_per_worker": sum(w["bytes_up"] for w in ws) / len(ws),
           "bytes_down_per_worker": sum(w["bytes_down"] for w in ws) / len(ws),
           "bytes_sent_per_worker": sum(w["bytes_up"] for w in ws) / len(ws),
           "measured_ms_per_iteration": measured, "emulated_ms_per_iteration": emulated,
           "cpu_seconds": sum(w["cpu_seconds"] for w in ws), "run_wall_s": round(time.time() - t_run, 1),
           "curve": [[t, round(acc, 4)] for t, acc, _ in ev["curve"]],
           "curve_to_target": bool(ev.get("to_target", False)), **machine, **extra}
    if method in ("ashl", "ashl_plus", "ashl_outer", "ashl_diloco_sw"):
        row["ratio"] = cfg["ratio"]
        row["switch_loss"] = a.switch_loss
    return row


def json_line(obj):
    return protocol.strict_json(obj) + "\n"


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def say(row, M=protocol.ACCURACY):
    t = row["time_to_target_s"]
    print(f"{LABEL[row['method']]:<32} seed {row['seed']} (attempt {row.get('attempt', 1)}): target at "
          f"{'-' if t is None else f'{t:g}'} s, final {'accuracy' if M.name == 'accuracy' else M.name} "
          f"{M.fmt(row[M.final_key])}, {row['iterations']} "
          f"iterations, {row['bytes_up_per_worker'] / 1e6:.1f}/{row['bytes_down_per_worker'] / 1e6:.1f} MB up/down "
          f"per worker, {row['measured_ms_per_iteration']:.0f}/{row['emulated_ms_per_iteration']:.0f} ms measured/"
          f"emulated (slowest group), overruns {row['overrun_fraction']:.2%}{' FLAGGED' if row.get('flagged') else ''}, "
          f"load {row['load_start']:.1f}-{row['load_end']:.1f}, other processes {row.get('foreign_busy', 0):.0%} of the machine, "
          f"{row['run_wall_s']:.0f} s", flush=True)


def run_clean(a, method, seed, cfg, tag, extra, log):
    """run_row until a run is not flagged (protocol.run_until_clean); every attempt is logged."""
    def attempt(k):
        row = run_row(a, method, seed, cfg, f"{tag}-a{k}", extra)
        row["flagged"] = protocol.flagged(row["overruns"], row["iterations"], foreign=row.get("foreign_busy"))
        row["attempt"] = k
        log.write(json_line(row))
        log.flush()
        say(row, a.W.metric)
        return row
    row, _ = protocol.run_until_clean(attempt, a.max_attempts)
    return row


# ------------------------------------------------------------------ modes

def installed_policies():
    """The policy names of the installed ashl module ([] without one)."""
    try:
        import ashl
    except ImportError:
        return []
    return protocol.policy_names(ashl._ashl.policy_help())


def check_runnable(methods):
    """Refuse, before anything starts, a method whose policy the installed module lacks (the DiLoCo family)."""
    if not any(m in protocol.NEEDS_POLICY for m in methods):
        return
    why = protocol.missing_policies(methods, installed_policies())
    if why:
        raise SystemExit(f"--methods: {why}")


def prepare(a):
    import torch
    torch.set_num_threads(1)
    check_runnable(a.methods)
    os.makedirs(a.out, exist_ok=True)
    a.W.common.prepare_data(a.data_dir_npy, a.data_dir)
    if any(not m.startswith("ddp") for m in a.methods):
        try:
            import ashl.torch  # noqa: F401
        except ImportError as e:
            raise SystemExit(f"the ashl Python module is not importable ({e}); `pip install .` in the repository, "
                             "or run only DDP methods")


def header(a, what, methods, seeds):
    print(f"# {what}: {a.W.title}, {a.workers} workers, K = {a.time_scale:g}, budget {a.budget:g} s per run, "
          f"ticks every {a.eval_every:g} s {a.W.common.EVAL_TEXT}, target {a.target}, methods "
          f"{','.join(methods)}, seeds {','.join(map(str, seeds))}, server link f_m {a.server_link_factor:g}, "
          f"order {a.order}; load average {os.getloadavg()[0]:.2f}", flush=True)


def ordered(a, methods, seed):
    return protocol.run_order(methods, seed) if a.order == "random" else list(methods)


def runs(a):
    """Ad hoc runs and --protocol: each seed's methods in a random order, flagged runs repeated."""
    frozen = load_frozen(a.config_file)
    extra = {}
    if a.protocol:
        if frozen is None:
            raise SystemExit(f"--protocol: no frozen tuning file {a.config_file}: run --tune and --freeze first, "
                             "and commit the file")
        ok, why = frozen_is_committed(a.config_file)
        if not ok:
            raise SystemExit(f"--protocol: {why}: the configuration must be committed before any test seed runs")
        try:
            protocol.check_frozen(frozen, a.seed_values)
        except ValueError as e:
            raise SystemExit(f"--protocol: {a.config_file}: {e}")
        extra = {"frozen_commit": why, "frozen_digest": frozen["digest"]}
    elif frozen is None:
        print(f"note: no frozen tuning file {a.config_file}: every method runs the default configuration "
              f"{json.dumps(a.W.default_config)} (not tuned)", flush=True)
    methods = resolve_methods(a, frozen)
    a.methods = methods
    untuned = [m for m in methods if frozen is not None and m not in frozen["chosen"]]
    if untuned:
        print(f"note: {a.config_file} has no entry for {','.join(untuned)}: they run the default configuration "
              f"{json.dumps(a.W.default_config)} (not tuned)", flush=True)
    prepare(a)
    header(a, "protocol" if a.protocol else "runs", methods, a.seed_values)
    t_all = time.time()
    path = os.path.join(a.out, "results.jsonl")
    done = set()
    if a.protocol:  # resumes the rows of this frozen file and budget; refuses a folder of other runs
        for r in read_rows(path):
            if r.get("frozen_digest") != frozen["digest"] or r["budget_s"] != a.budget or r["workers"] != a.workers:
                raise SystemExit(f"{path} holds runs of another configuration ({r['method']} seed {r['seed']}): "
                                 "use another --out")
            done.add((r["method"], r["seed"]))
    elif os.path.exists(path):
        os.remove(path)
    runs_left = a.max_runs or -1
    with open(path, "a") as results, open(os.path.join(a.out, "attempts.jsonl"), "a") as log:
        for seed in a.seed_values:
            order = ordered(a, methods, seed)
            print(f"seed {seed}: order {','.join(order)}", flush=True)
            for i, m in enumerate(order):
                if (m, seed) in done:
                    continue  # --protocol resumes
                if runs_left == 0:
                    print(f"--max-runs {a.max_runs}: stopping; run the same command again to go on", flush=True)
                    return 0
                runs_left -= 1
                row = run_clean(a, m, seed, config_for(a, m, frozen), f"{m}-seed{seed}",
                                dict(extra, order_index=i, order=order), log)
                results.write(json_line(row))
                results.flush()
    report(a, read_rows(path))
    print(f"# total {time.time() - t_all:.0f} s", flush=True)
    return 0


def tune(a):
    """Every grid configuration of every method on each tuning seed, in a random order per seed; resumable."""
    with open(a.grid) as f:
        grid = json.load(f)
    methods = [m for m in a.methods if m != "best_ddp"]
    a.methods = methods
    a.eval_to_target = True  # a tuning row needs the time to target and the final accuracy, not the whole curve
    prepare(a)
    header(a, "tuning", methods, a.tuning_seed_values)
    path = os.path.join(a.out, "tuning.jsonl")
    have = {(r["method"], protocol.config_key(r["config"]), r["seed"]) for r in read_rows(path)}
    runs_left = a.max_runs or -1
    with open(path, "a") as out, open(os.path.join(a.out, "attempts.jsonl"), "a") as log:
        for seed in a.tuning_seed_values:
            keys = [f"{m}#{i}" for m in methods for i in range(len(protocol.grid_configs(grid, m)))]
            for key in ordered(a, keys, seed):
                m, i = key.split("#")
                cfg = dict(a.W.default_config, **protocol.grid_configs(grid, m)[int(i)])
                if (m, protocol.config_key(cfg), seed) in have:
                    continue
                if runs_left == 0:
                    print(f"--max-runs {a.max_runs}: stopping; run the same command again to go on", flush=True)
                    return 0
                runs_left -= 1
                row = run_clean(a, m, seed, cfg, f"tune-{m}-{i}-seed{seed}", {"grid_index": int(i)}, log)
                out.write(json_line(row))
                out.flush()
    return 0


def freeze(a):
    with open(a.grid) as f:
        grid = json.load(f)
    M = a.W.metric
    rows = [{k: r[k] for k in ("method", "seed", "config", "time_to_target_s", M.final_key, "flagged")}
            for r in read_rows(os.path.join(a.out, "tuning.jsonl"))]
    # Rows carry the full configuration (defaults included): match them to the grid's by its keys.
    for r in rows:
        for c in grid["methods"][r["method"]]:
            if all(r["config"].get(k) == v for k, v in c.items()):
                r["config"] = dict(c)
                break
    try:
        body = protocol.freeze(grid, rows, a.tuning_seed_values, [m for m in a.methods if m != "best_ddp"],
                               a.budget, created=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), metric=M)
    except ValueError as e:  # an incomplete tuning (or none yet): say what is missing, no traceback
        raise SystemExit(f"--freeze: {e} (tuning rows read from {os.path.join(a.out, 'tuning.jsonl')}; "
                         f"run --tune first)")
    body["best_ddp"] = best_ddp_of(body, a.W.rivals, M)
    with open(a.freeze, "w") as f:
        json.dump(body, f, indent=1, sort_keys=True)
        f.write("\n")
    print(f"{a.freeze}: digest {body['digest']}; {a.W.rival_name} {body['best_ddp']}; commit it before --protocol")
    for m, c in body["chosen"].items():
        print(f"  {LABEL[m]:<32} {json.dumps(c['config'])}  median time {c['median_time_to_target_s']}")
    return 0


def report(a, rows):
    if not rows:
        print("no results", flush=True)
        return
    W, M = a.W, a.W.metric
    if a.report and a.target_given:  # the table at another score, from the curves
        cut = [r for r in rows if r.get("curve_to_target") and M.harder(a.target, r[M.target_key])]
        if cut:
            raise SystemExit(f"--target {a.target}: {len(cut)} rows' curves stop at their target "
                             f"{cut[0][M.target_key]} (--eval-to-target), e.g. {cut[0]['method']} seed "
                             f"{cut[0]['seed']}; a {'higher' if M.higher_is_better else 'lower'} target cannot be "
                             "read from them")
        rows = [dict(r, **{M.target_key: a.target},
                     time_to_target_s=protocol.first_reached(r["curve"], a.target, M)) for r in rows]
    target = rows[0][M.target_key]
    budget = rows[0]["budget_s"]
    s = protocol.summarize(rows, target, budget, n_boot=a.boot, metric=M, rivals=W.rivals, rival_name=W.rival_name)
    text = protocol.report_table(s)
    seeds = sorted({r["seed"] for r in rows})
    verdict = protocol.verdict_text(s)
    text = (f"{len(rows)} runs, seeds {','.join(map(str, seeds))}, {budget:g} s each, target {target}; medians "
            f"over seeds with percentile-bootstrap 95 % intervals ({a.boot} resamples; with one seed an interval "
            "is the point itself).\n\n" + text + "\n" + verdict + "\n\n"
            f"Every run's time to {target} (s; > {budget:g}: missed it within the budget; *: flagged):\n\n"
            + protocol.per_seed_table(rows, budget)
            + f"\nWhere the time goes (medians over seeds; {'samples' if W.tokens_per_sample == 1 else 'tokens'} "
              "seen at the target are the run's mean rate times its time to target):\n\n" + protocol.efficiency_table(s)
            + f"\nMedian time (s) to each {M.label} along the way, from the same curves:\n\n"
            + protocol.milestone_table(rows, budget, s["best_ddp"], metric=M, rival_name=W.rival_name))
    print("\n" + text, flush=True)
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        f.write(json_line(s))
    plot(a, rows)
    if not a.report and not a.protocol:  # ad hoc runs: read them beside the committed protocol
        committed = committed_result(W)
        if committed:
            print("\n" + committed, flush=True)
        elif W.name != "cnn":
            print(f"\nNo committed protocol result for this job yet ({W.rel}/protocol-runs/summary.json is not "
                  f"there; docs/perf/{W.name}.md says what has run).", flush=True)


def committed_result(W):
    """The committed protocol's ratios and verdict, printed after a
    demo's own table so that its one seed is read beside the five; None when
    the protocol's summary is not there."""
    if not os.path.exists(W.summary):
        return None
    with open(W.summary) as f:
        return protocol.protocol_result(protocol.load_summary(f.read()),
                                        where=f"{W.rel}/protocol-runs/table.md, docs/perf/{W.name}.md")


def plot(a, rows):
    """accuracy_vs_time.png with gnuplot (Debian gnuplot-nox); skipped with a note when it is missing.
    One line a run when the rows hold one seed; one a method (its median over the seeds) when more."""
    if not shutil.which("gnuplot"):
        print("note: gnuplot not found (apt-get install gnuplot-nox); no PNG written", flush=True)
        return None
    out, W = a.out, a.W
    seeds = sorted({r["seed"] for r in rows})
    if len(seeds) > 1:
        curves = [(m, "median", c) for m, c in protocol.median_curves(rows).items()]
    else:
        curves = [(r["method"], f"seed{r['seed']}", r["curve"]) for r in rows]
    files = []
    for m, which, curve in curves:
        path = f"{out}/curve_{m}_{which}.dat"
        with open(path, "w") as f:
            for t, acc in curve:
                f.write(f"{t} {acc}\n")
        files.append((m, path))
    term = "set terminal pngcairo size 1000,600" if "pngcairo" in terminals() else "set terminal png size 1000,600"
    png = "accuracy_vs_time.png" if W.metric.name == "accuracy" else f"{W.metric.name}_vs_time.png"
    over = f", median over seeds {','.join(map(str, seeds))}" if len(seeds) > 1 else f", seed {seeds[0]}"
    lines = [term, f'set output "{out}/{png}"',
             f'set title "{W.title}, {rows[0]["workers"]} heterogeneous workers '
             f'(K = {rows[0]["time_scale"]:g}){over}"',
             'set xlabel "wall-clock seconds"', f'set ylabel "{W.common.PLOT_YLABEL}"',
             f"set key {'bottom' if W.metric.higher_is_better else 'top'} right",
             "set grid", f"set yrange [{W.plot_yrange[0]}:{W.plot_yrange[1]}]",
             f'set arrow from graph 0, first {rows[0][W.metric.target_key]} to graph 1, first '
             f'{rows[0][W.metric.target_key]} nohead dt 2']
    # One colour a method (gnuplot's default cycle has 8, so a ninth would repeat the first).
    colours = ("#9400d3", "#009e73", "#56b4e9", "#e69f00", "#cc79a7", "#0072b2", "#e51e10", "#000000", "#a0522d",
               "#808000", "#008080", "#800000", "#4b0082")
    styles = {m: f'rgb "{colours[i % len(colours)]}"' for i, m in enumerate(protocol.KNOWN_METHODS)}
    lines.append("plot " + ", ".join(f'"{path}" using 1:2 with lines lw 2 lc {styles[m]} title "{LABEL[m]}"'
                                     for m, path in files))
    script = f"{out}/{png[:-4]}.gp"
    with open(script, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = subprocess.run(["gnuplot", script], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"note: gnuplot failed: {r.stderr.strip()}", flush=True)
        return None
    print(f"plot: {out}/{png}", flush=True)
    return f"{out}/{png}"


def terminals():
    r = subprocess.run(["gnuplot", "-e", "set terminal"], capture_output=True, text=True)
    return r.stdout + r.stderr


def main(argv, W):
    a = parse(argv, W)
    if a.role == "orchestrator":
        if a.report:
            a.out = os.path.abspath(a.report)
            report(a, read_rows(os.path.join(a.out, "results.jsonl")))
            return 0
        if a.freeze:
            return freeze(a)
        if a.tuning_status:
            with open(a.grid) as f:
                grid = json.load(f)
            rows = read_rows(os.path.join(a.tuning_status, "tuning.jsonl"))
            status = protocol.tuning_status(grid, rows, a.tuning_seed_values, [m for m in a.methods if m != "best_ddp"],
                                            a.budget, W.metric)
            if not a.update_doc:
                print(status, end="")
                return 0
            with open(a.update_doc) as f:
                doc = f.read()
            try:
                updated = protocol.splice_status(doc, status)
            except ValueError as e:
                sys.exit(f"--update-doc {a.update_doc}: {e}")
            with open(a.update_doc, "w") as f:
                f.write(updated)
            print(f"{a.update_doc}: {status.splitlines()[0]}")
            return 0
        if a.tune:
            return tune(a)
        return runs(a)
    a.data_dir = a.data_dir_npy
    # A process the orchestrator is about to kill is asked first (SIGUSR1) where it is stuck:
    # every thread's stack goes to its log.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if a.role == "ddp":
        import ddp_worker
        return ddp_worker.main(a)
    if a.role == "evaluator":
        import evaluator
        return evaluator.main(a)
    import ashl_worker
    return ashl_worker.main(a)
