#!/usr/bin/env python3
"""bench/torch_overlap.py — ashl.torch's overlap of communication with
backward and forward (docs/perf/torch.md).

An MLP of 10.5 M parameters (1024 -> 2048 -> 2048 -> 2048 -> 10, float32,
42 MB), BSP, one server and 4 workers over UCX on loopback, servers
stepping SGD on the gradients (update="gradient"). Two runs of the same job:

- serial: one bucket, the exchange inside step() after backward (what
  ashl.torch did before buckets overlapped);
- overlap: buckets of --bucket-mb (default "auto", ashl.torch's default
  rule: min(25 MiB, max(1 MiB, model / 4))), committed from the gradient
  hooks while backward runs, pulls waited for in forward pre-hooks; a
  parameter larger than --partition-mb (default 4, ashl.torch's default;
  "none": not cut) cut across several buckets, whose pieces are committed
  and pulled as a pipeline.

--policy (default bsp) and --policy-params (JSON of ps::policy_params
fields) run another policy, an adaptive one included (ashl, adsp, dlb: its
buckets follow the first bucket's cycle).

Emulation, as examples/cnn does it (so 4 workers fit on a small machine):
- links: ps::worker's emulated link (link_bytes_per_second): a commit of b
  bytes is held b / rate before it is sent, a pull reply b / rate after it
  arrived;
- compute: each Linear layer's forward sleeps compute_ms / 3 x its share
  of the parameters and its backward twice that (a GPU's time, spent without
  the host's cores), on top of the real (small-batch) CPU compute.

Figures (medians over the measured steps of every worker, then the median
of the workers): step time of each run; compute = the serial run's time
outside step(), comm = its time inside step(); ideal = max(compute, comm);
hidden = (serial - overlap) / min(compute, comm), the share of the
hideable communication that overlap hid; speed-up = serial / overlap; bytes
per worker and step (out + in); wait fraction = time the training thread
blocked on pulls / step time. One JSON object per run and one for the
comparison.

    PYTHONPATH=build/release/python python3 bench/torch_overlap.py [--steps 20] [--repeats 2]
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def args_of(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20, help="measured steps per run")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each mode, alternating")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--compute-ms", type=float, default=1000.0, help="emulated compute per step (fwd + bwd)")
    ap.add_argument("--rate", type=float, default=84e6, help="emulated link, bytes per second each way")
    ap.add_argument("--bucket-mb", default="auto", help='MiB, or "auto" (ashl.torch.bucket_cap_bytes)')
    ap.add_argument("--partition-mb", default="4",
                    help='MiB: a parameter larger is cut across buckets (ashl.torch.bucket_plan); "none": not cut')
    ap.add_argument("--policy", default="bsp")
    ap.add_argument("--policy-params", default="{}", help="JSON: ps::policy_params fields of --policy")
    ap.add_argument("--trace", default=None, help="Chrome traces of the last runs: PATH.serial.json, PATH.overlap.json")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # internal: mode,outdir
    return ap.parse_args(argv)


# ------------------------------------------------------------------ the job

def job_main(a):
    import torch
    import ashl
    import ashl.torch as at

    mode, outdir = a.job.split(",", 1)
    torch.set_num_threads(1)
    job = ashl.job()
    sizes = [1024, a.hidden, a.hidden, a.hidden, 10]
    total = sum(i * o + o for i, o in zip(sizes, sizes[1:]))

    class Pad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, seconds):
            ctx.seconds = seconds
            time.sleep(seconds)
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            time.sleep(2 * ctx.seconds)
            return g, None

    class Layer(torch.nn.Linear):
        def forward(self, x):
            share = (self.weight.numel() + self.bias.numel()) / total
            return Pad.apply(super().forward(x), a.compute_ms / 3e3 * share)

    torch.manual_seed(0)
    layers = []
    for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:])):
        layers.append(Layer(n_in, n_out))
        if i < len(sizes) - 2:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    cap = (a.bucket_mb if a.bucket_mb == "auto" else float(a.bucket_mb)) if mode == "overlap" else 0
    part = None if a.partition_mb == "none" else float(a.partition_mb)
    policy = ashl.Policy(a.policy, **json.loads(a.policy_params))
    if job.role == "server":
        at.serve(model, job, policy, "none", optimizer="sgd", lr=0.01, worker_timeout=120.0, bucket_cap_mb=cap,
                 partition_mb=part)
        return 0
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model, policy, "none",
                                  update="gradient", timeout=120.0, link_bytes_per_second=a.rate,
                                  bucket_cap_mb=cap, partition_mb=part, overlap=mode == "overlap",
                                  trace=a.trace or "")
    g = torch.Generator().manual_seed(job.rank)
    x = torch.randn(a.batch, 1024, generator=g)
    y = torch.randint(0, 10, (a.batch,), generator=g)
    steps, inside, waits = [], [], []
    t_prev = None
    for it in range(a.warmup + a.steps):
        if it == a.warmup:
            opt.wait()
            tel0 = opt.telemetry
            w0 = opt.wait_seconds
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        if it >= a.warmup:
            steps.append(t1 - t_prev)
            inside.append(t1 - t0)
        t_prev = t1
    opt.wait()
    tel = opt.telemetry
    n = a.steps
    res = {"mode": mode, "rank": job.rank, "buckets": len(opt.buckets), "params": total,
           "step_s": statistics.median(steps), "in_step_s": statistics.median(inside),
           "bytes_per_step": (tel["bytes_out"] + tel["bytes_in"] - tel0["bytes_out"] - tel0["bytes_in"]) / n,
           "wait_fraction": (opt.wait_seconds - w0) / sum(steps),
           "link_s_per_step": (tel["link_seconds"] - tel0["link_seconds"]) / n,
           "commits_per_step": (tel["buckets"][0]["commits"] - tel0["buckets"][0]["commits"]) / n,
           "stage": opt.plan.stage}
    opt.leave()
    with open(os.path.join(outdir, f"{mode}-{job.rank}.json"), "w") as f:
        json.dump(res, f)
    return 0


# ---------------------------------------------------------------- the driver

def run_mode(a, mode, outdir):
    import ashl
    env = dict(os.environ, UCX_NET_DEVICES=os.environ.get("UCX_NET_DEVICES", "lo"))
    cmd = [sys.executable, os.path.abspath(__file__), "--job", f"{mode},{outdir}", "--steps", str(a.steps),
           "--warmup", str(a.warmup), "--hidden", str(a.hidden), "--batch", str(a.batch), "--compute-ms",
           str(a.compute_ms), "--rate", str(a.rate), "--bucket-mb", str(a.bucket_mb), "--partition-mb", str(a.partition_mb), "--policy", a.policy,
           "--policy-params", a.policy_params]
    trace = os.path.abspath(f"{a.trace}.{mode}.json") if a.trace else None
    if trace:
        cmd += ["--trace", trace]
    done = ashl.run(cmd, servers=1, workers=a.workers, timeout=600, env=env, check=False, capture_output=True,
                    text=True, trace=trace)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"torch_overlap: the {mode} job failed (exit {done.returncode})")
    rows = []
    for r in range(a.workers):
        with open(os.path.join(outdir, f"{mode}-{r}.json")) as f:
            rows.append(json.load(f))
    return rows


def main(a):
    import torch
    med = statistics.median
    runs = {"serial": [], "overlap": []}
    for rep in range(a.repeats):
        for mode in ("serial", "overlap"):
            with tempfile.TemporaryDirectory() as d:
                rows = run_mode(a, mode, d)
            r = {"mode": mode, "repeat": rep, "buckets": rows[0]["buckets"], "params": rows[0]["params"],
                 "step_s": med([x["step_s"] for x in rows]), "in_step_s": med([x["in_step_s"] for x in rows]),
                 "bytes_per_worker_step": med([x["bytes_per_step"] for x in rows]),
                 "wait_fraction": med([x["wait_fraction"] for x in rows]),
                 "link_s_per_step": med([x["link_s_per_step"] for x in rows]),
                 "commits_per_step": med([x["commits_per_step"] for x in rows]), "stage": rows[0]["stage"]}
            runs[mode].append(r)
            print(json.dumps(r), flush=True)
    s = {k: med([r[k] for r in runs["serial"]]) for k in ("step_s", "in_step_s")}
    o_step = med([r["step_s"] for r in runs["overlap"]])
    comm = s["in_step_s"]
    compute = s["step_s"] - comm
    ideal = max(compute, comm)
    hidden = (s["step_s"] - o_step) / min(compute, comm)
    out = {"bench": "torch_overlap", "machine": f"{platform.node()} {os.cpu_count()} cpus {platform.processor()}",
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "torch": torch.__version__,
           "workers": a.workers, "params": runs["serial"][0]["params"], "bucket_mb": a.bucket_mb,
           "partition_mb": a.partition_mb, "load_average": os.getloadavg(),
           "policy": a.policy, "policy_params": json.loads(a.policy_params),
           "buckets": runs["overlap"][0]["buckets"], "rate": a.rate, "compute_ms": a.compute_ms,
           "steps": a.steps, "repeats": a.repeats, "serial_step_s": s["step_s"], "overlap_step_s": o_step,
           "compute_s": compute, "comm_s": comm, "ideal_s": ideal, "hidden": hidden,
           "speedup": s["step_s"] / o_step,
           "bytes_per_worker_step": {m: med([r["bytes_per_worker_step"] for r in runs[m]]) for m in runs},
           "wait_fraction": {m: med([r["wait_fraction"] for r in runs[m]]) for m in runs}}
    print(f"{'':>10} {'step ms':>9} {'wait %':>7} {'MB/step':>8}")
    for m in ("serial", "overlap"):
        print(f"{m:>10} {1e3 * (s['step_s'] if m == 'serial' else o_step):9.1f} "
              f"{100 * out['wait_fraction'][m]:7.1f} {out['bytes_per_worker_step'][m] / 1e6:8.1f}")
    print(f"compute {1e3 * compute:.1f} ms, comm {1e3 * comm:.1f} ms, max(compute, comm) {1e3 * ideal:.1f} ms; "
          f"hidden {100 * hidden:.0f} % of min(compute, comm) (goal >= 70 %), speed-up {out['speedup']:.2f}x "
          "(goal >= 1.3x)")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    a = args_of()
    sys.exit(job_main(a) if a.job else main(a))
