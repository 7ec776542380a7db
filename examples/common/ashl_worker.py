"""The server and the workers of an ashl run of an example's comparison
(BSP, ADSP, ASHL, ASHL+; the DiLoCo family once the module has its
policy), through the Python module: ``ashl.torch.serve`` in the server
process, ``ashl.torch.DistributedOptimizer`` around the workers' inner
optimizer (the workload's: the CNN's SGD with momentum, the language
model's AdamW). Streaming DiLoCo (streaming_diloco_4bit, and
streaming_diloco_4bit_2way with 4-bit replies) runs
``ashl.torch.StreamingDiLoCo`` around the same inner optimizer instead,
and the server process runs one ashl.Server per fragment
(``fragment_servers``: protocol.fragment_server_settings, the 4-bit codec
in the servers' own settings), all behind the one server link.

Started by an example's run.py (``--role server`` / ``--role worker``,
harness.py); the emulation is the workload's (a.W.common) and link.py's,
the same as ddp_worker.py's:

- Compute: each local iteration (forward, backward) is padded by a sleep to
  the workload's iteration time (the CNN's f_c x K x 10 ms x batch / 64)
  from its start, before the optimizer's step (which commits and pulls when
  the plan says).
- Links: link.Link through the module's ``link`` hook (ps::worker's
  link_hold): a commit's bytes (headers and payload, as encoded) cross the
  worker's up channel and the server's down channel before they are sent,
  a reply's the server's up and the worker's down channel after it arrived;
  the server's channels (its own rate, --server-link-factor) are shared by
  all nine workers (link.ServerPort). StreamingDiLoCo takes the same hook
  for every fragment's worker (its exchanges run on their own threads, so
  a fragment's transfer overlaps the next tau inner steps, as the method
  means it to); the bytes each worker's link carried are counted alike.
- Loss: the policies read a global loss (ASHL switches from AHL to SHL below
  ``switch_loss``, ADSP rewards commit rates by it; both in the workload's
  training loss). Worker 0 reports the
  mean loss of its last 20 batches every 1.25 s (the reference's 0.25
  reference s x K): free, where the reference server evaluates 1,000
  training images.
- Evaluation: the server process writes the server's own parameters
  (ashl.Server.parameters(), one version, taken between two passes of its
  loop) at every tick to the run's ticks/ for the evaluator (ticks.py).
"""
import collections
import json
import os
import threading
import time
import types

import torch

import ashl
import ashl.torch
import ddp_worker
import link as lk
import protocol
import ticks

# The reference experiment's policy settings (examples/experiment_common.hpp
# make_setup), durations x K since the server's policy reads wall time; ASHL's
# r0 and switch loss come from run.py (--ratio, --switch-loss), ADSP's target
# loss from the workload (the CNN's 0.4).
def policy_of(a):
    method, time_scale = a.method, a.time_scale
    if method == "bsp":
        return ashl.Policy("bsp")
    if method == "adsp":
        return ashl.Policy("adsp", period=1.0 * time_scale, search_every=1000.0 * time_scale,
                           target_loss=a.W.adsp_target_loss, initial_commit_rate=1)
    if method in protocol.NEEDS_POLICY:
        # harness.check_runnable refused these before the run when the module lacks the policy.
        # The DiLoCo family's Python names (test_cnn_protocol.py asserts each one's settings,
        # test_cnn_diloco.py serves each one).
        s = protocol.outer_policy_settings(method, a.config, a.switch_loss)
        return ashl.Policy(s["policy"], **s["policy_params"])
    params = dict(protocol.ASHL_PLAN, compression_ratio=a.config.get("ratio", 0.3), switch_loss=a.switch_loss)
    if method == "ashl_plus":
        params.update(replanner="profile", replan_drift=0.5, replan_half_life=8)
    return ashl.Policy("ashl", **params)


def server_optimizer(method):
    """serve()'s optimizer for a method: the model deltas' sum (model_delta)
    for BSP, ADSP and ASHL; None for the DiLoCo family, whose policy runs its
    outer optimizer from the policy's outer_* parameters (the server refuses
    any other optimizer beside it)."""
    return None if method in protocol.NEEDS_POLICY else "model_delta"


def job_of(a, role):
    return ashl.Job(role=role, rank=a.rank if role == "worker" else 0, num_workers=a.workers, num_servers=1,
                    server_addresses=(f"127.0.0.1:{a.port}",), token=os.environ.get("ASHL_TOKEN", ""),
                    insecure=not os.environ.get("ASHL_TOKEN"))


def server_flat(model, buckets, flats):
    """The servers' parameters (one flat array per bucket, each in its
    bucket's order: reverse registration; a parameter cut across buckets in
    pieces, ashl.torch.bucket_plan) in registration order."""
    by_id = {}
    for pieces, flat in zip(buckets, flats):
        off = 0
        for _, p, _, size in pieces:
            by_id.setdefault(id(p), []).append(torch.from_numpy(flat[off:off + size]))
            off += size
    return torch.cat([t for p in model.parameters() for t in by_id[id(p)]])


def fragment_servers(a, model, fabric=None):
    """Streaming DiLoCo's servers: one ashl.Server per fragment of the model
    (ashl.torch.layer_fragment_sizes, StreamingDiLoCo's split), each over
    its fragment's initial values with protocol.fragment_server_settings
    (the diloco policy, H, the outer optimizer, block4 at 0.125; for
    streaming_diloco_4bit_2way block4 replies too), on a port
    of its own ("127.0.0.1:0": the addresses go to the workers in a file,
    fragment_addresses). Started; returns them (fragment order)."""
    settings = protocol.fragment_server_settings(a.method, a.config, a.workers)
    sizes = ashl.torch.layer_fragment_sizes(model, protocol.STREAMING["fragments"])
    with torch.no_grad():  # StreamingDiLoCo's order: the parameters, tied ones once
        initial = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float32).numpy()
    token = os.environ.get("ASHL_TOKEN", "")
    servers, lo = [], 0
    for f, n in enumerate(sizes):
        where = dict(fabric=fabric, listen=f"fragment{f}") if fabric is not None else dict(listen="127.0.0.1:0")
        srv = ashl.Server(size=n, initial=initial[lo:lo + n].copy(), token=token, insecure=not token,
                          worker_timeout=60.0, **where, **settings)
        srv.start()
        servers.append(srv)
        lo += n
    return servers


def fragment_addresses(run_dir):
    """Each fragment server's address list (StreamingDiLoCo's servers), as
    the server process wrote them before it wrote "listening"."""
    with open(f"{run_dir}/fragments.json") as f:
        return [[x] for x in json.load(f)]


def server(a):
    cc = a.W.common
    torch.set_num_threads(1)
    model = cc.make_model(a.seed)
    if a.method in protocol.STREAMING_METHODS:
        srv = ashl.torch.Servers(fragment_servers(a, model))
        cc.write_file(f"{a.run_dir}/fragments.json", json.dumps([s.address for s in srv.servers]) + "\n")

        def flat():  # the fragments' parameters, in the parameters' order
            return torch.cat([torch.from_numpy(x) for x in srv.parameters()])
    else:
        srv = ashl.torch.serve(model, job_of(a, "server"), policy=policy_of(a),
                               compression="topk", optimizer=server_optimizer(a.method), worker_timeout=60.0,
                               background=True)
        buckets = ashl.torch.bucket_plan(model)  # serve()'s: bucket_cap_mb "auto", partition_mb 4
        params = (lambda: srv.parameters()) if len(buckets) > 1 else (lambda: [srv.parameters()])

        def flat():
            return server_flat(model, buckets, params())
    cc.write_file(f"{a.run_dir}/listening", "1\n")
    t0 = cc.wait_for_start(a.run_dir)
    writer = ticks.TickWriter(a.run_dir, t0, a.eval_every, a.budget)
    done = threading.Event()

    def publish():  # the server's parameters at each tick, for the evaluator
        while not done.is_set():
            due = writer.due(cc.mono())
            for k, _ in due:
                writer.write(k, flat())
            if writer.next > writer.count:
                return
            done.wait(max(0.0, writer.time_of(writer.next) - cc.mono()))

    th = threading.Thread(target=publish, name="ticks", daemon=True)
    th.start()
    srv.join()
    done.set()
    th.join()
    writer.finish(flat())
    tel = srv.telemetry
    if a.method in protocol.STREAMING_METHODS:
        tel = {"fragments": tel.pop("buckets")}
    cc.write_file(f"{a.run_dir}/server.json", json.dumps(tel, default=str) + "\n")
    return 0


class StreamingRun:
    """ashl.torch.StreamingDiLoCo under the names the worker loop reads of a
    DistributedOptimizer (step, zero_grad, commits, plan, telemetry, ...).
    The schedule is protocol.streaming_worker_settings' (P, H, tau, alpha);
    each fragment's worker commits with its servers' codec (4-bit, with
    error feedback) through ``link``. Its servers read no global loss
    (report_metric does nothing) and its constructor's join pulled the
    model (synchronize does nothing)."""

    def __init__(self, inner, model, servers, a, link, batch_size):
        self.settings = protocol.streaming_worker_settings(a.config)
        token = os.environ.get("ASHL_TOKEN", "")
        self.sd = ashl.torch.StreamingDiLoCo(inner, model, servers, rank=a.rank, timeout=120.0, token=token,
                                             insecure=not token, link=link, fabric=getattr(a, "fabric", None),
                                             **self.settings)
        self.batch_size = batch_size

    def zero_grad(self):
        self.sd.zero_grad()

    def step(self):
        return self.sd.step()

    def synchronize(self):
        pass

    def report_metric(self, name, value):
        pass

    @property
    def commits(self):
        return self.sd.syncs  # fragment syncs: each one commit of one fragment

    @property
    def plan(self):
        p = self.sd.workers[0].plan
        return types.SimpleNamespace(local_iterations=self.settings["local_steps"],
                                     stage=f"streaming P={self.settings['fragments']}",
                                     compression_ratio=p["compression_ratio"], batch_size=self.batch_size)

    @property
    def codecs(self):
        return [w.codec for w in self.sd.workers]

    @property
    def telemetry(self):
        return self.sd.telemetry

    def leave(self):
        self.sd.leave()


def worker(a):
    cc = a.W.common
    torch.set_num_threads(1)
    rank, n = a.rank, a.workers
    run_dir = a.run_dir
    data = cc.Data(a.data_dir)
    model = cc.make_model(a.seed)
    rate = cc.link_rate(rank, a.time_scale, n)
    deadline = cc.mono() + 120.0
    while not os.path.exists(f"{run_dir}/server-link"):
        if cc.mono() > deadline:
            raise SystemExit(f"worker {rank}: no {run_dir}/server-link within 120 s")
        time.sleep(0.02)
    link = lk.Link(rate, server=lk.ServerPort(f"{run_dir}/server-link", a.server_rate))
    costing = {"on": False}  # the first pull (the initial model, DDP's constructor broadcast) is not costed

    def hold(direction, nbytes):
        if costing["on"]:
            link.hold(direction, nbytes)

    cfg = a.config
    sgd = cc.inner_optimizer(model.parameters(), cfg, a)  # the CNN's SGD with momentum, the LM's AdamW
    while not os.path.exists(f"{run_dir}/listening"):
        if cc.mono() > deadline:
            raise SystemExit(f"worker {rank}: the server did not listen within 120 s")
        time.sleep(0.02)
    if a.method in protocol.STREAMING_METHODS:
        opt = StreamingRun(sgd, model, fragment_addresses(run_dir), a, link=hold, batch_size=cc.BATCH)
    else:
        opt = ashl.torch.DistributedOptimizer(sgd, model, policy=policy_of(a).name,
                                              compression="topk", job=job_of(a, "worker"), batch_size=cc.BATCH,
                                              timeout=120.0, seed=a.seed, error_feedback=a.method == "ashl_plus",
                                              link=hold,
                                              # The exchange inside step(), serially after the padded compute
                                              # (timed from the iteration's start), as DDP's hook runs it.
                                              overlap=False)
    cc.write_file(f"{run_dir}/ready-{rank}", "1\n")
    t0 = cc.wait_for_start(run_dir)
    # A fresh pull just before the start (not costed), so the first cycle's
    # compute (ASHL profiles it) does not count the wait for the other processes.
    cc.sleep_until(t0 - 0.02)
    opt.synchronize()
    cc.sleep_until(t0)
    costing["on"] = True
    t_end = t0 + a.budget
    losses = collections.deque(maxlen=20)
    next_report = t0 + 1.25
    commits = steps = samples = overruns = 0
    pad_seconds = 0.0
    stages = [(0.0, opt.plan.stage)]  # (seconds since the start, stage) at every change of the plan's stage
    while cc.mono() < t_end:
        it0 = cc.mono()
        lr = ddp_worker.lr_at(cfg["lr"], cfg.get("warmup_s", 0.0), it0 - t0)
        for g in sgd.param_groups:
            g["lr"] = lr
        b = opt.batch_size
        inputs = cc.train_batch(data, a.seed, rank, steps, b)
        opt.zero_grad()
        loss = cc.loss(model, inputs)
        loss.backward()
        losses.append(loss.item())
        pad = cc.iteration_seconds(rank, a.time_scale, b, n)
        pad_seconds += pad
        until = it0 + pad
        if cc.mono() > until:
            overruns += 1
        cc.sleep_until(until)
        opt.step()  # the local step; a commit and a pull (emulated link inside) when the plan says
        steps += 1
        samples += b
        now = cc.mono()
        if opt.commits != commits:
            commits = opt.commits
            stage = opt.plan.stage
            if stage != stages[-1][1]:
                stages.append((round(now - t0, 3), stage))
        if rank == 0 and now >= next_report:
            opt.report_metric("loss", sum(losses) / len(losses))
            next_report += 1.25
    tel = opt.telemetry
    plan = opt.plan
    codecs = {"codecs": opt.codecs} if isinstance(opt, StreamingRun) else {}  # each fragment's, as its servers set it
    wall = cc.mono() - t0
    opt.leave()
    ls = link.stats()
    stats = {"rank": rank, "steps": steps, "samples": samples, "overruns": overruns, "commits": commits,
             "bytes_sent": ls["bytes_up"], "bytes_up": ls["bytes_up"], "bytes_down": ls["bytes_down"],
             "module_bytes_out": int(tel.get("bytes_out", 0)), "module_bytes_in": int(tel.get("bytes_in", 0)),
             "link_seconds": ls["link_seconds"], "transfers": ls["transfers"], "pad_seconds": pad_seconds,
             "wall_seconds": wall, "wait_seconds": tel.get("wait_seconds", 0.0),
             "plan": {"local_iterations": plan.local_iterations, "stage": plan.stage,
                      "compression_ratio": plan.compression_ratio, "batch_size": plan.batch_size},
             "stages": stages, **codecs,
             "cpu_seconds": time.process_time()}
    cc.write_file(f"{run_dir}/worker-{rank}.json", json.dumps(stats) + "\n")
    return 0


def main(a):
    return server(a) if a.role == "server" else worker(a)
