"""The server and the workers of an ashl run of the CNN example (BSP, ADSP,
ASHL, ASHL+), through the Python module: ``ashl.torch.serve`` in the server
process, ``ashl.torch.DistributedOptimizer`` around the workers' SGD.

Started by run.py (``--role server`` / ``--role worker``); the emulation is
cnn_common.py's, the same as ddp_worker.py's:

- Compute: each local iteration (forward, backward) is padded by a sleep to
  f_c x K x 10 ms x batch / 64 from its start, before the optimizer's step
  (which commits and pulls when the plan says).
- Links: the module's ``link_bytes_per_second`` (ps::worker's emulated
  link): a commit of b bytes is held b / rate before it is sent, a pull
  reply of b bytes b / rate after it arrived.
- Loss: the policies read a global loss (ASHL switches from AHL to SHL below
  ``switch_loss``, ADSP rewards commit rates by it). Worker 0 reports the
  mean loss of its last 20 batches every 1.25 s (the reference's 0.25
  reference s x K): free, where the reference server evaluates 1,000
  training images.
- Snapshots: worker 0 keeps the parameters it last pulled from the server,
  and at every tick the copy of that moment; run.py evaluates them after the
  run. The server's own model is newer by at most worker 0's cycle (it is in
  the fastest group), so this errs against ashl.
"""
import collections
import json
import os
import time

import torch
import torch.nn.functional as F

import ashl
import ashl.torch
import cnn_common as cc

# The reference experiment's policy settings (examples/experiment_common.hpp
# make_setup), durations x K since the server's policy reads wall time; ASHL's
# r0 and switch loss come from run.py (--ratio, --switch-loss).
def policy_of(a):
    method, time_scale = a.method, a.time_scale
    if method == "bsp":
        return ashl.Policy("bsp")
    if method == "adsp":
        return ashl.Policy("adsp", period=1.0 * time_scale, search_every=1000.0 * time_scale, target_loss=0.4,
                           initial_commit_rate=1)
    params = dict(profile_iterations=5, h_ahl=8, h_shl=2, shl_staleness=3, compression_ratio=a.ratio,
                  switch_loss=a.switch_loss, planner="profile", profile_trim=2)
    if method == "ashl_plus":
        params.update(replanner="profile", replan_drift=0.5, replan_half_life=8)
    return ashl.Policy("ashl", **params)


def job_of(a, role):
    return ashl.Job(role=role, rank=a.rank if role == "worker" else 0, num_workers=a.workers, num_servers=1,
                    server_addresses=(f"127.0.0.1:{a.port}",), token=os.environ.get("ASHL_TOKEN", ""),
                    insecure=not os.environ.get("ASHL_TOKEN"))


def server(a):
    torch.set_num_threads(1)
    model = cc.make_model(a.seed)
    srv = ashl.torch.serve(model, job_of(a, "server"), policy=policy_of(a),
                           compression="topk", optimizer="model_delta", worker_timeout=60.0, background=True)
    cc.write_file(f"{a.run_dir}/listening", "1\n")
    srv.join()
    cc.write_file(f"{a.run_dir}/server.json", json.dumps(srv.telemetry, default=str) + "\n")
    return 0


def worker(a):
    torch.set_num_threads(1)
    rank, n = a.rank, a.workers
    run_dir = a.run_dir
    data = cc.Data(a.data_dir)
    model = cc.make_model(a.seed)
    rate = cc.link_rate(rank, a.time_scale, n)
    sgd = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    deadline = cc.mono() + 120.0
    while not os.path.exists(f"{run_dir}/listening"):
        if cc.mono() > deadline:
            raise SystemExit(f"worker {rank}: the server did not listen within 120 s")
        time.sleep(0.02)
    opt = ashl.torch.DistributedOptimizer(sgd, model, policy=policy_of(a).name,
                                          compression="topk", job=job_of(a, "worker"), batch_size=64,
                                          timeout=120.0, seed=a.seed, error_feedback=a.method == "ashl_plus",
                                          link_bytes_per_second=rate,
                                          # The exchange inside step(), as measured in docs/perf/cnn.md:
                                          # the compute padding below is timed from the iteration's start,
                                          # and worker 0 snapshots the pulled parameters after step().
                                          overlap=False)
    cc.write_file(f"{run_dir}/ready-{rank}", "1\n")
    t0 = cc.wait_for_start(run_dir)
    # A fresh pull just before the start, so the first cycle's compute (ASHL
    # profiles it) does not count the wait for the other processes; the pull
    # is held for its emulated time, so it starts that much before t0.
    cc.sleep_until(t0 - (cc.model_bytes(model) + 72) / rate - 0.005)
    opt.synchronize()
    cc.sleep_until(t0)
    t_end = t0 + a.budget
    losses = collections.deque(maxlen=20)
    snapshots, next_tick, next_report = [], t0 + a.eval_every, t0 + 1.25
    def flat():  # registration order (run.py's vector_to_parameters); the buckets hold them in reverse
        return torch.cat([p.detach().reshape(-1) for p in model.parameters()])

    pulled = flat()
    commits = steps = samples = overruns = 0
    stages = [(0.0, opt.plan.stage)]  # (seconds since the start, stage) at every change of the plan's stage
    while cc.mono() < t_end:
        it0 = cc.mono()
        b = opt.batch_size
        x, y = data.train_batch(cc.batch_indices(a.seed, rank, steps, b, len(data.train_y)))
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        losses.append(loss.item())
        until = it0 + cc.iteration_seconds(rank, a.time_scale, b, n)
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
            if rank == 0:
                pulled.copy_(flat())  # what the server sent, before the next local step
        if rank == 0:
            while next_tick <= now and next_tick <= t_end + 1e-9:
                snapshots.append((next_tick - t0, pulled.clone()))
                next_tick += a.eval_every
            if now >= next_report:
                opt.report_metric("loss", sum(losses) / len(losses))
                next_report += 1.25
    tel = opt.telemetry
    plan = opt.plan
    opt.leave()
    if rank == 0:
        while next_tick <= t_end + 1e-9:
            snapshots.append((next_tick - t0, pulled.clone()))
            next_tick += a.eval_every
        torch.save({"ticks": [t for t, _ in snapshots], "params": torch.stack([p for _, p in snapshots]),
                    "final": pulled}, f"{run_dir}/snapshots.pt")
    stats = {"rank": rank, "steps": steps, "samples": samples, "overruns": overruns, "commits": commits,
             "bytes_sent": int(tel.get("bytes_out", 0)), "bytes_received": int(tel.get("bytes_in", 0)),
             "link_seconds": tel.get("link_seconds", 0.0), "wait_seconds": tel.get("wait_seconds", 0.0),
             "plan": {"local_iterations": plan.local_iterations, "stage": plan.stage,
                      "compression_ratio": plan.compression_ratio, "batch_size": plan.batch_size},
             "stages": stages,
             "cpu_seconds": time.process_time()}
    cc.write_file(f"{run_dir}/worker-{rank}.json", json.dumps(stats) + "\n")
    return 0


def main(a):
    return server(a) if a.role == "server" else worker(a)
