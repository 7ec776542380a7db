"""One DDP rank of an example's comparison (the CNN's, the language
model's): torch.distributed with gloo on 127.0.0.1 under the emulated
heterogeneity, in one of five variants, each with torch 1.13's own hooks
and classes. The workload's hooks (a.W.common) give the model, the
batches, the loss and the inner optimizer (the CNN's SGD with momentum,
the language model's AdamW); B is its batch (the CNN's 64 images):

- ddp: fp32 all-reduce (default_hooks.allreduce_hook), batch B per rank.
- ddp_fp16: default_hooks.fp16_compress_hook.
- ddp_powersgd: powerSGD_hook.PowerSGDState(matrix_approximation_rank =
  the knob, start_powerSGD_iter) + powerSGD_hook.
- ddp_localsgd: post-local SGD, post_localSGD_hook.PostLocalSGDState
  (start_localSGD_iter, post_local_gradient_allreduce=False: each rank is
  a node of its own, no gradient all-reduce after the start) +
  post_localSGD_hook, and torch.distributed.optim.
  PostLocalSGDOptimizer over averagers.PeriodicModelAverager(period = the
  knob H, warmup_steps = the same start).
- ddp_propbatch: fp32 all-reduce, per-rank batches proportional to the
  rank's speed (89/59/44 for the CNN's three groups, 576 in all as for ddp); each
  rank's loss is scaled by n x b_i / B so the averaged gradient is the
  global batch's mean.

Emulation (the workload's iteration_seconds, link.py):

- Compute: the hook DDP calls when backward produced the first bucket (the
  CNN's 247 kB are one bucket) first sleeps until the iteration's pad
  (the CNN's f_c x K x 10 ms x batch / 64) from its start; later buckets
  of the same step find the pad already over.
- Links: every torch.distributed.all_reduce of this process is costed by
  link.costed_all_reduce (the ring's bytes on the rank's link, both
  directions at once) before it runs: the hooks' all-reduces, PowerSGD's P
  and Q, post-local SGD's averaging. Nothing else goes over the network
  during training: the stop is decided without a collective (rank 0 writes
  the step after which all stop into a file; the ranks are in lock step
  through their all-reduces, so all of them read it in time).
- Evaluation: rank 0 writes the parameters current at each tick (after the
  last completed step; for post-local SGD after warm-up, the last averaged
  ones, the model the method stands for) to the run's ticks/ for the
  evaluator process (ticks.py).
"""
import datetime
import faulthandler
import json
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
from torch.distributed.algorithms.model_averaging import averagers
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import link as lk
import protocol
import ticks


def _no_buffer_sync_per_forward():
    """DDP's keyword that turns off the buffer broadcast at each forward, in the name this torch
    knows: `forward_sync_buffers` since 2.13 (`broadcast_buffers` warns there), else the old one."""
    import inspect
    if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def lr_at(lr, warmup_s, t):
    """Linear warm-up from lr / 10 to lr over the first warmup_s seconds of the run (every method alike)."""
    if warmup_s <= 0 or t >= warmup_s:
        return lr
    return lr * (0.1 + 0.9 * max(0.0, t) / warmup_s)


def batch_of(cc, method, rank, n):
    if method == "ddp_propbatch":
        return protocol.propbatch_sizes(cc.COMPUTE_FACTOR, n, cc.BATCH * n)[rank]
    return cc.BATCH


def padded_hook(inner, step_state, clock, sleep_until):
    """The communication hook that pads: DDP calls it once per bucket (the
    CNN's one; the language model's two, DDP's first bucket holding 1 MB).
    The first call of a step (step_state["first"]) sleeps until the pad's
    end (step_state["until"]) and counts an overrun when it is already past;
    later calls of the same step come after its costed all-reduce, past the
    pad by design, and neither sleep nor count."""
    def padded(state_, bucket):
        if step_state["first"]:
            step_state["first"] = False
            if clock() > step_state["until"]:
                step_state["overruns"] += 1
            sleep_until(step_state["until"])
        return inner(state_, bucket)
    return padded


def main(a):
    cc = a.W.common
    torch.set_num_threads(1)
    rank, n, method = a.rank, a.workers, a.method
    cfg = a.config
    run_dir = a.run_dir
    data = cc.Data(a.data_dir)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=120))
    model = cc.make_model(a.seed)
    # Broadcasts rank 0's parameters (all equal already) once, before the clock starts; no buffer
    # broadcast per forward (the models have no buffers that train: said explicitly, so no collective
    # but the hook's). torch >= 2.13 names that `forward_sync_buffers` and warns on the old name.
    ddp = DDP(model, **_no_buffer_sync_per_forward())
    link = lk.Link(cc.link_rate(rank, a.time_scale, n))
    lk.costed_all_reduce(link)
    batch = batch_of(cc, method, rank, n)
    total_batch = sum(batch_of(cc, method, r, n) for r in range(n))
    loss_scale = n * batch / total_batch  # 1 for equal batches
    sgd = cc.inner_optimizer(ddp.parameters(), cfg, a)  # the CNN's SGD with momentum, the LM's AdamW
    opt = sgd
    sync_gap = 1  # steps between two all-reduces that every rank joins (the stop rule's margin)
    start_local = 0
    if method in ("ddp", "ddp_propbatch"):
        inner, state = default_hooks.allreduce_hook, None
    elif method == "ddp_fp16":
        inner, state = default_hooks.fp16_compress_hook, None
    elif method == "ddp_powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=int(cfg["powersgd_rank"]),
                                            start_powerSGD_iter=int(cfg.get("powersgd_start", 50)),
                                            random_seed=a.seed)
        inner = powerSGD_hook.powerSGD_hook
    elif method == "ddp_localsgd":
        start_local = int(cfg.get("localsgd_start", 50))
        # Each rank is a node of its own: no gradient all-reduce after the start (the default's
        # intra-node subgroups need CUDA in torch 1.13, and would be one rank each here).
        state = post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None,
                                                     start_localSGD_iter=start_local,
                                                     post_local_gradient_allreduce=False)
        inner = post_localSGD_hook.post_localSGD_hook
        period = int(cfg["local_period"])
        opt = PostLocalSGDOptimizer(optim=sgd, averager=averagers.PeriodicModelAverager(period=period,
                                                                                        warmup_steps=start_local))
        sync_gap = period + 1
    else:
        raise SystemExit(f"ddp_worker: {method!r} is not a DDP method")
    pad = cc.iteration_seconds(rank, a.time_scale, batch, n)
    step_state = {"until": 0.0, "overruns": 0, "padded": 0.0, "first": False}

    ddp.register_comm_hook(state, padded_hook(inner, step_state, cc.mono, cc.sleep_until))
    cc.write_file(f"{run_dir}/ready-{rank}", "1\n")
    t0 = cc.wait_for_start(run_dir)
    t_end = t0 + a.budget
    writer = ticks.TickWriter(run_dir, t0, a.eval_every, a.budget) if rank == 0 else None
    stop_file = f"{run_dir}/stop-after"
    stop_after = None
    flat = lambda: torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()
    current = flat() if rank == 0 else None
    steps = 0
    link_before_start = link.seconds
    cc.sleep_until(t0)
    while True:
        it0 = cc.mono()
        lr = lr_at(cfg["lr"], cfg.get("warmup_s", 0.0), it0 - t0)
        for g in sgd.param_groups:
            g["lr"] = lr
        inputs = cc.train_batch(data, a.seed, rank, steps, batch)
        opt.zero_grad(set_to_none=False)
        step_state["until"] = it0 + pad
        step_state["first"] = True
        (cc.loss(ddp, inputs) * loss_scale).backward()  # the hook pads, then the costed all-reduce
        opt.step()  # post-local SGD: the periodic averaging (costed) inside
        steps += 1
        now = cc.mono()
        if rank == 0:
            # post-local SGD: steps 1..start all-reduce gradients; PeriodicModelAverager averages at
            # steps start + 1, start + 1 + H, ... (its counter is the step count - 1)
            consistent = method != "ddp_localsgd" or steps <= start_local or (steps - start_local - 1) % period == 0
            for k, _ in writer.due(now):
                writer.write(k, current)  # the model as it was at the tick (this step's update came at `now`)
            if consistent:
                current = flat()
            if stop_after is None and now >= t_end:
                stop_after = steps + sync_gap
                cc.write_file(stop_file, f"{stop_after}\n")
        elif stop_after is None and os.path.exists(stop_file):
            with open(stop_file) as f:
                stop_after = int(f.read())
        if stop_after is not None and steps >= stop_after:
            break
    if rank == 0:
        writer.finish(current)
    ls = link.stats()
    stats = {"rank": rank, "steps": steps, "samples": steps * batch, "batch": batch, "overruns": step_state["overruns"],
             "bytes_sent": ls["bytes_up"], "bytes_up": ls["bytes_up"], "bytes_down": ls["bytes_down"],
             "link_seconds": ls["link_seconds"] - link_before_start, "transfers": ls["transfers"],
             "pad_seconds": steps * pad, "wall_seconds": cc.mono() - t0,
             "cpu_seconds": time.process_time()}
    cc.write_file(f"{run_dir}/worker-{rank}.json", json.dumps(stats) + "\n")
    leave(rank, n, run_dir, cc)
    return 0


def leave(rank, n, run_dir, cc, deadline_s=30.0):
    """Tear the process group down with rank 0 last: it hosts the TCP store, and
    a rank whose store went away first can hang in gloo's teardown (seen once
    in CI on torch 1.13, pytorch/pytorch#75097). Every result is written
    before this. The others leave first and say so in a file; rank 0 waits
    for them (at most deadline_s) before it leaves. If a teardown still sticks,
    every thread's stack goes to the log after deadline_s, and the
    orchestrator's kill after its grace fails the run with that log."""
    faulthandler.dump_traceback_later(deadline_s)
    dist.barrier()  # once, after the clock
    if rank != 0:
        dist.destroy_process_group()
        cc.write_file(f"{run_dir}/left-{rank}", "1\n")
    else:
        until = cc.mono() + deadline_s
        names = [f"{run_dir}/left-{r}" for r in range(1, n)]
        while not all(os.path.exists(f) for f in names) and cc.mono() < until:
            time.sleep(0.02)
        missing = [f for f in names if not os.path.exists(f)]
        if missing:
            print(f"ddp_worker: rank 0 leaves without {missing} after {deadline_s:g} s", flush=True)
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
