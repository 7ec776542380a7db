"""The evaluator of an example's run: a process of its own that
evaluates the parameters the run wrote at each tick (ticks.py: the ashl
server's, DDP rank 0's) on the workload's held-out set (the CNN's 10,000
test images, the language model's validation slice), and the final ones.

It never competes with the training for a core:

- deferred (the default): it waits, polling a file every 0.25 s, until
  run.py writes `done` after the training processes ended, then evaluates
  every tick on all the machine's cores;
- concurrent (run.py --eval-cpus LIST): it is pinned to those CPUs, which
  run.py takes away from every training process, and evaluates each tick
  as it appears.

With --eval-to-target (the tuning's default) it stops at the first tick
that reaches --target and evaluates the final parameters: the ticks after
it cannot change a time to target, and each costs about 0.8 s of the run.

Started by run.py (``--role evaluator``); writes the run's curve.json:
{"curve": [[t, score, loss], ...], "final_<metric>", "final_loss", "mode",
and the size of the set under the workload's eval_unit: "images", "bytes"}.
"""
import json
import os
import time

import numpy as np
import torch

import ticks


def main(a):
    cc, M = a.W.common, a.W.metric
    run_dir = a.run_dir
    cpus = sorted(os.sched_getaffinity(0))
    concurrent = bool(a.eval_cpus)
    if concurrent:
        os.sched_setaffinity(0, a.eval_cpus)
        cpus = a.eval_cpus
    data = cc.Data(a.data_dir)
    held_out = cc.eval_set(data)
    model = cc.make_model(a.seed)
    count = ticks.tick_count(a.eval_every, a.budget)
    cc.write_file(f"{run_dir}/ready-evaluator", "1\n")
    done = f"{run_dir}/done"
    t0 = cc.wait_for_start(run_dir, timeout=600.0)
    give_up = t0 + a.budget + 600.0  # run.py went away: do not wait for ever

    def wait_done():
        if cc.mono() > give_up:
            raise SystemExit(f"evaluator: no {done} 600 s after the run's end")
    if not concurrent:
        while not os.path.exists(done):
            wait_done()
            time.sleep(0.25)
    torch.set_num_threads(len(cpus))
    curve, k = [], 1
    while k <= count:
        path = ticks.tick_path(run_dir, k)
        if not os.path.exists(path):
            if os.path.exists(done) and not os.path.exists(path):
                raise SystemExit(f"evaluator: {path} missing after the run ended")
            wait_done()
            time.sleep(0.05)
            continue
        torch.nn.utils.vector_to_parameters(torch.from_numpy(np.load(path)), model.parameters())
        score, loss = cc.score(model, held_out)
        curve.append([round(k * a.eval_every, 3), score, loss])
        k += 1
        if a.eval_to_target and M.reached(score, a.target):
            break
    while not os.path.exists(ticks.final_path(run_dir)):
        if os.path.exists(done) and not os.path.exists(ticks.final_path(run_dir)):
            raise SystemExit(f"evaluator: {ticks.final_path(run_dir)} missing after the run ended")
        wait_done()
        time.sleep(0.05)
    torch.nn.utils.vector_to_parameters(torch.from_numpy(np.load(ticks.final_path(run_dir))), model.parameters())
    final, final_loss = cc.score(model, held_out)
    cc.write_file(f"{run_dir}/curve.json", json.dumps({"curve": curve, M.final_key: final,
                                                       "final_loss": final_loss,
                                                       a.W.eval_unit: cc.eval_size(held_out),
                                                       "mode": "concurrent" if concurrent else "deferred",
                                                       "to_target": bool(a.eval_to_target),
                                                       "cpus": list(cpus)}) + "\n")
    return 0
