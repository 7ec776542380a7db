"""One DDP worker of the CNN example: torch.distributed with gloo on
127.0.0.1, under the emulated heterogeneity of the reference experiment.

Started by run.py (``--role ddp``); see cnn_common.py for the emulation.

- Compute: the iteration's forward and backward are padded to f_c x K x
  10 ms from its start by a sleep in the communication hook, which DDP calls
  when backward has produced a bucket's gradients (the CNN's 247 kB fit in
  DDP's first bucket of 1 MB, so that is the end of backward, and DDP has
  nothing to overlap, as ashl's worker, which commits after the step).
- Links: the hook then sleeps, before it all-reduces a bucket of b bytes,
  for 2 (n - 1) / n x b / rate: the bytes a ring all-reduce sends
  (and, on the full-duplex link, receives at the same time) through each
  worker's link. Each rank sleeps by its own rate and the all-reduce waits
  for the last one, as a ring waits for its slowest link.
- Snapshots: rank 0 keeps a copy of the parameters as they were at every
  evaluation tick (the model of the last step completed by the tick) and
  writes them at the end; run.py evaluates them afterwards, off the clock,
  as it does for the ashl runs.
"""
import datetime
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import cnn_common as cc


def main(a):
    torch.set_num_threads(1)
    rank, n = a.rank, a.workers
    run_dir = a.run_dir
    data = cc.Data(a.data_dir)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank, world_size=n,
                            timeout=datetime.timedelta(seconds=120))
    model = cc.make_model(a.seed)
    ddp = DDP(model)
    rate = cc.link_rate(rank, a.time_scale, n)
    link = {"seconds": 0.0, "bytes": 0, "until": 0.0, "overruns": 0}

    def emulated_link(state, bucket):
        if cc.mono() > link["until"]:
            link["overruns"] += 1
        cc.sleep_until(link["until"])  # the compute padding (later buckets: already past)
        b = bucket.buffer().numel() * bucket.buffer().element_size()
        hold = 2.0 * (n - 1) / n * b / rate
        link["seconds"] += hold
        link["bytes"] += b
        time.sleep(hold)
        t = bucket.buffer().div_(n)
        return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

    ddp.register_comm_hook(None, emulated_link)
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)
    pad = cc.iteration_seconds(rank, a.time_scale, 64, n)
    cc.write_file(f"{run_dir}/ready-{rank}", "1\n")
    t0 = cc.wait_for_start(run_dir)
    dist.barrier()
    t_end = t0 + a.budget
    snapshots, next_tick = [], t0 + a.eval_every
    steps = 0
    cc.sleep_until(t0)
    while True:
        it0 = cc.mono()
        idx = cc.batch_indices(a.seed, rank, steps, 64, len(data.train_y))
        x, y = data.train_batch(idx)
        opt.zero_grad(set_to_none=False)
        link["until"] = it0 + pad
        F.cross_entropy(ddp(x), y).backward()  # the hook pads, holds the link and all-reduces
        if rank == 0:
            before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        opt.step()
        steps += 1
        now = cc.mono()
        if rank == 0:
            while next_tick <= now and next_tick <= t_end + 1e-9:
                snapshots.append((next_tick - t0, before))
                next_tick += a.eval_every
        # Every rank stops after the same step: rank 0's clock decides.
        stop = torch.tensor([1.0 if now >= t_end else 0.0])
        dist.broadcast(stop, 0)
        if stop.item() > 0:
            break
    if rank == 0:
        final = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        while next_tick <= t_end + 1e-9:
            snapshots.append((next_tick - t0, final))
            next_tick += a.eval_every
        torch.save({"ticks": [t for t, _ in snapshots], "params": torch.stack([p for _, p in snapshots]),
                    "final": final}, f"{run_dir}/snapshots.pt")
    stats = {"rank": rank, "steps": steps, "samples": steps * 64, "overruns": link["overruns"],
             "link_seconds": link["seconds"], "bytes_sent": int(2.0 * (n - 1) / n * link["bytes"]),
             "cpu_seconds": time.process_time()}
    cc.write_file(f"{run_dir}/worker-{rank}.json", json.dumps(stats) + "\n")
    dist.destroy_process_group()
    return 0

