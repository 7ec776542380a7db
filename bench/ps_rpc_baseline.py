#!/usr/bin/env python3
"""bench/ps_rpc_baseline.py — a plain PyTorch RPC parameter server, the
baseline that ashl_bench_ps_ucx's commit cycle and pull are measured
against (docs/perf/ps-ucx.md, "Against PyTorch RPC").

What it runs: torch.distributed.rpc with the TensorPipe backend, two
processes on this host, 127.0.0.1 only. The server (rank 0, "server")
holds the parameters, a float32 tensor of X bytes; the worker (rank 1)

- push:  rpc_sync(server, _push, (t,)): sends a float32 tensor of X bytes,
         the server adds it in place (params.add_(t)), returns None;
- pull:  rpc_sync(server, _pull): the server returns its parameters, the
         worker receives a fresh tensor of X bytes (it does not copy it into
         a model: one copy fewer than ashl's pull, which checks the reply
         and copies it into the caller's buffer);
- cycle: push then pull, one after the other: the same two transfers of X
         as ashl's commit cycle (commit + wait).

Placement as ashl_bench_ps_ucx's: the server pinned to CPU 0, the worker
to CPU 1 (os.sched_setaffinity before torch starts a thread;
--no-pin leaves it to the scheduler), torch.set_num_threads(1) in both
(ashl's server applies on one thread by default).

Lanes (--lanes), the TensorPipe transport (control messages and the
pickled call) and channel (the tensor's bytes) forced through
TensorPipeRpcBackendOptions(_transports=, _channels=):
  shm   transport shm (shared-memory rings), channel cma
        (process_vm_readv: the receiver copies straight from the sender's
        tensor) — what TensorPipe picks by itself on one host, and the
        peer of ashl's shm lane (UCX sysv + cma);
  tcp   transport uv (TCP over loopback, TP_SOCKET_IFNAME=lo), channel
        basic (the tensor's bytes over the same connection) — the peer of
        ashl's tcp lane (UCX tcp);
  default  no _transports/_channels: TensorPipe's own choice (recorded as
        "tensorpipe default");
  T+C   any other pair, e.g. uv+mpt_uv, shm+basic.

Sizes: 4 KiB .. 64 MiB (4K,64K,1M,16M,64M), --quick 4K,1M,16M, as
ashl_bench_ps_ucx. Every figure is the median of --reps repetitions
(default 7, --quick 3); a repetition is the mean of `iters` operations in
a row (iters as ashl_bench_ps_ucx: 64 MiB worth, 2..2000; --quick 16 MiB
worth, 2..500; a loop stops early, after at least 2, once it ran
--max-rep-s, default 0.5 s), after 3 warm-up cycles. One server and worker pair per
lane serves every size and repetition (RPC's start-up takes about a
second; ashl starts fresh processes per repetition): the parameters are
reset to zeros per size. Every size ends with a check that the pulled
parameters equal the sum of every push the server received (check: ok).

With --with-ashl PATH (ashl_bench_ps_ucx), the same run first runs
`PATH --json-only --ops pull,commit` with the same sizes, lanes (shm, tcp)
and repetitions, then this baseline, and prints one table: ashl's commit
cycle against rpc push+pull (ratio = rpc / ashl; the goal in docs/perf/ps-ucx.md:
>= 3 at >= 1 MiB) and ashl's pull against rpc's pull.

    python3 bench/ps_rpc_baseline.py [--quick] [--reps N] [--lanes shm,tcp]
    flock /tmp/ashl-bench.lock python3 bench/ps_rpc_baseline.py \\
        --with-ashl build/release/bench/ashl_bench_ps_ucx

Output: a human table, then one JSON object per case:
  {"bench":"ps_rpc","lane":...,"tp_transport":...,"tp_channel":...,"bytes":...,
   "push_usec":...,"pull_usec":...,"cycle_usec":...,"push_gbps":...,"pull_gbps":...,
   "cycle_gbps":...,"check":"ok",...}
and with --with-ashl one {"bench":"ps_vs_rpc",...} per lane and size.
Works with Debian's torch 1.13 (/usr/bin/python3) and torch 2.x.
"""
import argparse
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KiB, MiB = 1024, 1024 * 1024
LANES = {"shm": ("shm", "cma"), "tcp": ("uv", "basic"), "default": (None, None)}
RESULT = "RESULT "  # the prefix of the worker's one line of results on stdout

# ---------------------------------------------------------------- the server
# Functions the worker calls by reference (pickled as module + name): the
# server runs this file, so they resolve to the same definitions there.

_params = None


def _reset(n):
    """Parameters of n float32 zeros; returns how many elements."""
    global _params
    import torch
    _params = torch.zeros(n, dtype=torch.float32)
    return n


def _push(t):
    """Adds the worker's tensor into the parameters in place."""
    _params.add_(t)


def _pull():
    """The parameters themselves: TensorPipe sends from this tensor."""
    return _params


# ------------------------------------------------------------------- helpers

def parse_size(s):
    s = s.strip()
    unit = {"K": KiB, "M": MiB}.get(s[-1:].upper(), 1)
    return int(float(s[:-1] if unit != 1 else s) * unit)


def human(b):
    return f"{b // MiB} MiB" if b >= MiB and b % MiB == 0 else f"{b // KiB} KiB" if b % KiB == 0 else f"{b} B"


def size_arg(b):
    return f"{b // MiB}M" if b >= MiB and b % MiB == 0 else f"{b // KiB}K" if b % KiB == 0 else str(b)


def lane_of(name):
    """(transport, channel) of a lane name: shm, tcp, default, or T+C."""
    if name in LANES:
        return LANES[name]
    if "+" in name:
        t, c = name.split("+", 1)
        return t, c
    raise SystemExit(f"ps_rpc_baseline: --lanes: '{name}' is not shm, tcp, default or TRANSPORT+CHANNEL")


def iters_of(bytes_, quick):
    """Operations per repetition: ashl_bench_ps_ucx's ashl_iters."""
    target = (16 if quick else 64) * MiB
    return max(2, min(500 if quick else 2000, int(target / bytes_)))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(cpu, on):
    """The calling process (and every thread it starts later) on one CPU."""
    if on and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {cpu % os.cpu_count()})


def placement(on):
    return "server cpu0, client cpu1" if on and (os.cpu_count() or 1) >= 2 else "unpinned"


def loadavg():
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def machine():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()} {os.cpu_count()} cpus {model}".strip()


def rpc_env():
    """Loopback only: TensorPipe's uv transport and mpt_uv channel listen on
    the interface TP_SOCKET_IFNAME names (else the one the hostname resolves to)."""
    env = dict(os.environ)
    env["TP_SOCKET_IFNAME"] = "lo"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def backend_options(port, transport, channel, timeout_s=120.0):
    from torch.distributed import rpc
    kw = {}
    if transport:
        kw["_transports"] = [transport]
    if channel:
        kw["_channels"] = [channel]
    return rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=timeout_s,
                                           num_worker_threads=4, **kw)


def start_server(port, lane, pin_on=False, python=None, stderr=None, env=None):
    """The server process (this file, --role server), for the driver and the test."""
    cmd = [python or sys.executable, os.path.abspath(__file__), "--role", "server", "--port", str(port),
           "--lanes", lane] + ([] if pin_on else ["--no-pin"])
    return subprocess.Popen(cmd, env=env or rpc_env(), stdout=subprocess.DEVNULL, stderr=stderr)


def probe_lane(a, lane):
    """What TensorPipe used on `lane`, from its own log (TP_VERBOSE_LOGGING=3)
    of a short untimed run: the channels the pipes opened connections for,
    and the transports connections were accepted on (either process)."""
    env = dict(rpc_env(), TP_VERBOSE_LOGGING="3")
    cmd = ["--lanes", lane, "--sizes", "4K", "--reps", "1", "--iters", "1", "--no-pin"]
    rc, _, log = run_pair(cmd, lane, False, env, 120)
    channels = sorted(set(re.findall(r"\(for channel (\w+)\)", log)))
    transports = {}
    for t in re.findall(r"accepting connection on transport (\w+)", log):
        transports[t] = transports.get(t, 0) + 1
    if not channels and not transports:
        return f"unknown (no TensorPipe log; exit {rc})"
    return (f"channel {','.join(channels) or '?'}; connections on "
            + ", ".join(f"{t} x{n}" for t, n in sorted(transports.items())))


def run_pair(worker_args, lane, pin_on, env, timeout, worker_stderr=None):
    """A server and a worker (this file) on a free port: (worker's exit code,
    its stdout, the processes' stderr). Logs go to files (the worker's to
    worker_stderr when given), never to a pipe nobody reads while the
    processes run (TensorPipe's verbose log fills one)."""
    port = free_port()
    with tempfile.TemporaryFile() as srv_log, tempfile.TemporaryFile() as wk_log:
        srv = start_server(port, lane, pin_on=pin_on, stderr=srv_log, env=env)
        cmd = [sys.executable, os.path.abspath(__file__), "--role", "worker", "--port", str(port)] + worker_args
        cmd += [] if pin_on else ["--no-pin"]
        try:
            w = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=worker_stderr or wk_log, text=True,
                               timeout=timeout)
            out, rc = w.stdout, w.returncode
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            rc = "timeout"
        try:
            srv.wait(timeout=30)
        except subprocess.TimeoutExpired:
            srv.kill()
            srv.wait()
        logs = []
        for f in (wk_log, srv_log):
            f.seek(0)
            logs.append(f.read().decode(errors="replace"))
        return rc, out, "\n".join(logs)


# ------------------------------------------------------------------- roles

def server_main(a):
    pin(0, a.pin)  # before torch starts its threads: they inherit the mask
    # A worker that imported this file as a module (the test) names the
    # functions ps_rpc_baseline._push: the same definitions as __main__'s.
    sys.modules.setdefault("ps_rpc_baseline", sys.modules[__name__])
    import torch
    from torch.distributed import rpc
    torch.set_num_threads(1)
    t, c = lane_of(a.lanes)
    rpc.init_rpc("server", rank=0, world_size=2, rpc_backend_options=backend_options(a.port, t, c))
    rpc.shutdown()  # waits for the worker's shutdown: serves its calls until then
    return 0


def worker_main(a):
    pin(1, a.pin)
    import torch
    from torch.distributed import rpc
    torch.set_num_threads(1)
    t, c = lane_of(a.lanes)
    rpc.init_rpc("worker", rank=1, world_size=2, rpc_backend_options=backend_options(a.port, t, c))
    me = sys.modules[__name__]  # the server resolves these by the same name
    rows = []
    try:
        for bytes_ in [parse_size(s) for s in a.sizes.split(",")]:
            n = bytes_ // 4
            iters = a.iters or iters_of(bytes_, a.quick)
            g = torch.full((n,), 1.0 / 1024, dtype=torch.float32)  # sums of 2^-10 stay exact in f32
            rpc.rpc_sync("server", me._reset, args=(n,))
            pushes = 0

            def push():
                nonlocal pushes
                rpc.rpc_sync("server", me._push, args=(g,))
                pushes += 1

            def pull():
                return rpc.rpc_sync("server", me._pull)

            for _ in range(3):  # warm-up: connections, the channel's first transfers
                push()
                pull()
            def timed(op):
                # The mean of `iters` operations, or of as many as --max-rep-s
                # allowed (at least 2): a loaded machine stretches a 4 KiB
                # call to milliseconds, and 2000 of them to minutes.
                t0, done = time.perf_counter(), 0
                while done < iters:
                    op()
                    done += 1
                    if done >= 2 and time.perf_counter() - t0 > a.max_rep_s:
                        break
                return (time.perf_counter() - t0) / done, done

            push_s, pull_s, cycle_s, ops = [], [], [], []
            last = [None]

            def cycle():
                push()
                last[0] = pull()

            for _ in range(a.reps):
                for op, out in ((push, push_s), (pull, pull_s), (cycle, cycle_s)):
                    t, done = timed(op)
                    out.append(t)
                    ops.append(done)
            p = last[0]
            # Every push landed once: the parameters are the sum of what was sent.
            want = pushes / 1024.0
            bad = int((p != want).sum())
            check = "ok" if p.numel() == n and bad == 0 else f"{bad} of {n} elements differ from {want}"
            rows.append({"bytes": bytes_, "iters": min(ops), "push_s": push_s, "pull_s": pull_s, "cycle_s": cycle_s,
                         "pushes": pushes, "check": check})
            print(f"  {a.lanes} {human(bytes_)}: push {1e6 * statistics.median(push_s):.1f} us, pull "
                  f"{1e6 * statistics.median(pull_s):.1f} us, cycle {1e6 * statistics.median(cycle_s):.1f} us, "
                  f"check {check}", file=sys.stderr, flush=True)
    finally:
        rpc.shutdown()
    print(RESULT + json.dumps(rows), flush=True)
    return 0


# ------------------------------------------------------------------- driver

def run_lane(a, lane, sizes):
    """One server and one worker on `lane`; the worker's rows (or an error)."""
    args = ["--lanes", lane, "--sizes", ",".join(size_arg(b) for b in sizes), "--reps", str(a.reps),
            "--iters", str(a.iters), "--max-rep-s", str(a.max_rep_s)] + (["--quick"] if a.quick else [])
    rc, out, log = run_pair(args, lane, a.pin, rpc_env(), a.timeout,
                            worker_stderr=sys.stderr if not a.json_only else None)  # progress per size
    line = next((ln for ln in out.splitlines() if ln.startswith(RESULT)), None)
    if rc != 0 or line is None:
        return None, f"worker exit {rc}: {' | '.join(log.strip().splitlines()[-3:])}"
    return json.loads(line[len(RESULT):]), ""


def rpc_rows(a, sizes, lanes):
    import torch  # only for its version: the processes import it themselves
    med = statistics.median
    rows = []
    for lane in lanes:
        t, c = lane_of(lane)
        seen = probe_lane(a, lane)
        print(f"  {lane}: TensorPipe used {seen}", file=sys.stderr, flush=True)
        got, err = run_lane(a, lane, sizes)
        for i, b in enumerate(sizes):
            r = {"bench": "ps_rpc", "lane": lane, "tp_transport": t or "tensorpipe default",
                 "tp_channel": c or "tensorpipe default", "tp_seen": seen, "bytes": b}
            if got is None:
                r["error"] = err
            else:
                g = got[i]
                push, pull, cycle = med(g["push_s"]), med(g["pull_s"]), med(g["cycle_s"])
                r.update(push_usec=push * 1e6, pull_usec=pull * 1e6, cycle_usec=cycle * 1e6,
                         push_gbps=b / push * 1e-9, pull_gbps=b / pull * 1e-9, cycle_gbps=2 * b / cycle * 1e-9,
                         iters=g["iters"], check=g["check"])
                if g["check"] != "ok":
                    r["error"] = "check: " + g["check"]
            r.update(reps=a.reps, placement=placement(a.pin), torch=torch.__version__,
                     python=platform.python_version(), machine=machine(),
                     date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
            rows.append(r)
    return rows


def run_ashl(a, sizes):
    """ashl_bench_ps_ucx --json-only --ops pull,commit on the same sizes and lanes."""
    cmd = [a.with_ashl, "--json-only", "--ops", "pull,commit", "--transports", "shm,tcp",
           "--sizes", ",".join(size_arg(b) for b in sizes), "--reps", str(a.reps)]
    cmd += (["--quick"] if a.quick else []) + ([] if a.pin else ["--no-pin"]) + a.ashl_arg
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=a.timeout)
    out = {}
    for ln in p.stdout.splitlines():
        if ln.startswith("{"):
            j = json.loads(ln)
            out[(j["op"], j["transport"], j["bytes"])] = j
    if not out:
        raise SystemExit(f"ps_rpc_baseline: {a.with_ashl} printed no results (exit {p.returncode})")
    return out, p.returncode


def ms(x):
    return "-" if x is None else f"{x / 1e3:.3f}"


def ratio(x, y):
    return None if x is None or not y else x / y


def fmt(x, d=2):
    return "-" if x is None else f"{x:.{d}f}"


def main(a):
    try:
        import torch
        from torch.distributed import rpc
        if not rpc.is_available():
            raise ImportError("torch.distributed.rpc is not available in this build")
    except ImportError as e:
        print(f"ps_rpc_baseline: {sys.executable} has no usable torch ({e}); Debian: apt-get install "
              "python3-torch, or run it with a venv's python", file=sys.stderr)
        return 77
    sizes = [parse_size(s) for s in a.sizes.split(",")] if a.sizes else \
        [4 * KiB, MiB, 16 * MiB] if a.quick else [4 * KiB, 64 * KiB, MiB, 16 * MiB, 64 * MiB]
    lanes = a.lanes.split(",")
    for lane in lanes:
        lane_of(lane)
    load0 = loadavg()
    ashl, ashl_rc = run_ashl(a, sizes) if a.with_ashl else ({}, 0)
    load1 = loadavg()
    rows = rpc_rows(a, sizes, lanes)
    load = f"{load0} -> {load1} -> {loadavg()}" if a.with_ashl else f"{load0} -> {loadavg()}"
    errors = any("error" in r for r in rows) or ashl_rc != 0

    if not a.json_only:
        import torch
        print(f"\nps_rpc_baseline on {machine()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, python "
              f"{platform.python_version()}, torch {torch.__version__}, {placement(a.pin)}, median of {a.reps}; "
              f"load average {load}\n")
        print(f"{'lane':<12} {'transport+channel':<18} {'bytes':>8} {'push us':>10} {'pull us':>10} {'cycle us':>10}"
              f" {'push GB/s':>9} {'pull GB/s':>9} {'check':>6}")
        for r in rows:
            tc = f"{r['tp_transport']}+{r['tp_channel']}" if r["lane"] != "default" else "(default)"
            if "push_usec" in r:
                print(f"{r['lane']:<12} {tc:<18} {human(r['bytes']):>8} {r['push_usec']:10.1f} {r['pull_usec']:10.1f}"
                      f" {r['cycle_usec']:10.1f} {r['push_gbps']:9.3f} {r['pull_gbps']:9.3f} {r['check'][:6]:>6}")
            else:
                print(f"{r['lane']:<12} {tc:<18} {human(r['bytes']):>8}  ERROR: {r['error']}")
        print()
    for r in rows:
        print(json.dumps(dict(r, load=load)))

    if a.with_ashl:
        if not a.json_only:
            print(f"\nashl ({os.path.basename(a.with_ashl)}) against PyTorch RPC, same run; ratio = rpc / ashl "
                  "(goal: cycle >= 3 at >= 1 MiB); ms per operation\n")
            print(f"{'bytes':>8} {'lane':<5} {'ashl commit':>11} {'rpc push+pull':>13} {'ratio':>6} {'goal':>5}"
                  f" {'ashl pull':>10} {'rpc pull':>9} {'ratio':>6} {'rpc push':>9} {'am_bw 2X':>9}")
        joined = []
        for lane in lanes:
            if lane not in ("shm", "tcp"):
                continue
            for b in sizes:
                ac, ap = ashl.get(("commit", lane, b)), ashl.get(("pull", lane, b))
                rr = next(r for r in rows if r["lane"] == lane and r["bytes"] == b)
                a_commit, a_pull = ac and ac.get("usec"), ap and ap.get("usec")
                cyc = ratio(rr.get("cycle_usec"), a_commit)
                pul = ratio(rr.get("pull_usec"), a_pull)
                goal = None if b < MiB or cyc is None else cyc >= 3.0
                j = {"bench": "ps_vs_rpc", "lane": lane, "bytes": b, "ashl_commit_usec": a_commit,
                     "rpc_cycle_usec": rr.get("cycle_usec"), "cycle_ratio": cyc, "goal": ">= 3" if b >= MiB else "",
                     "met": goal, "ashl_pull_usec": a_pull, "rpc_pull_usec": rr.get("pull_usec"), "pull_ratio": pul,
                     "rpc_push_usec": rr.get("push_usec"), "am_bw_2x_usec": ac and ac.get("baseline_usec"),
                     "ashl_commit_vs_am_bw": ac and ac.get("ratio"), "ashl_pull_vs_am_bw": ap and ap.get("ratio"),
                     "ashl_lanes": ac and ac.get("lanes"), "rpc_lane": f"{rr['tp_transport']}+{rr['tp_channel']}",
                     "reps": a.reps, "load": load, "date": rr["date"], "machine": rr["machine"],
                     "torch": rr["torch"]}
                if not a.json_only:
                    print(f"{human(b):>8} {lane:<5} {ms(a_commit):>11} {ms(rr.get('cycle_usec')):>13} {fmt(cyc):>6}"
                          f" {('-' if goal is None else 'yes' if goal else 'no'):>5} {ms(a_pull):>10}"
                          f" {ms(rr.get('pull_usec')):>9} {fmt(pul):>6} {ms(rr.get('push_usec')):>9}"
                          f" {ms(ac and ac.get('baseline_usec')):>9}")
                joined.append(j)
        if not a.json_only:
            print()
        for j in joined:
            print(json.dumps(j))
    return 1 if errors else 0


def args_of(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 4K,1M,16M, 3 reps, 16 MiB worth per repetition")
    ap.add_argument("--reps", type=int, default=0, help="repetitions per size (default 7, --quick 3)")
    ap.add_argument("--iters", type=int, default=0, help="operations per repetition (default: as ashl_bench_ps_ucx)")
    ap.add_argument("--max-rep-s", type=float, default=0.5,
                    help="seconds after which an operation's loop in a repetition stops early (at least 2 ops)")
    ap.add_argument("--sizes", default="", help="e.g. 4K,64K,1M,16M,64M")
    ap.add_argument("--lanes", default="shm,tcp", help="shm, tcp, default, or TRANSPORT+CHANNEL (e.g. uv+mpt_uv)")
    ap.add_argument("--no-pin", dest="pin", action="store_false", help="leave placement to the scheduler")
    ap.add_argument("--json-only", action="store_true")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per lane (and for the ashl run)")
    ap.add_argument("--with-ashl", default="", metavar="PATH", help="ashl_bench_ps_ucx to run first, same sizes")
    ap.add_argument("--ashl-arg", action="append", default=[], help="one more argument for ashl_bench_ps_ucx")
    ap.add_argument("--role", choices=["driver", "server", "worker"], default="driver", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.reps <= 0:
        a.reps = 3 if a.quick else 7
    return a


if __name__ == "__main__":
    a = args_of()
    if a.role == "server":
        sys.exit(server_main(a))
    if a.role == "worker":
        sys.exit(worker_main(a))
    sys.exit(main(a))
