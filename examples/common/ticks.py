"""Evaluation ticks: the process that holds a method's model (the ashl
server, DDP's rank 0) writes the parameters current at each tick, t0 + k x
every, into the run's ticks/ folder; the evaluator (evaluator.py, another
process) evaluates them. Writing 247 kB every 2.5 s is all the training
processes pay for evaluation.

    w = TickWriter(run_dir, t0, every=2.5, budget=300)
    for k, t in w.due(now): w.write(k, flat_params)   # flat: registration order, float32
    w.finish(flat_params)                               # the ticks left, and final.npy
"""
import os

import numpy as np


def tick_path(run_dir, k):
    return os.path.join(run_dir, "ticks", f"tick-{k:05d}.npy")


def final_path(run_dir):
    return os.path.join(run_dir, "ticks", "final.npy")


def save(path, flat):
    tmp = path + ".tmp.npy"
    np.save(tmp, np.asarray(flat, dtype=np.float32))
    os.replace(tmp, path)  # whole or not at all: the evaluator polls for these names


def tick_count(every, budget):
    return int(budget / every + 1e-9)


class TickWriter:
    def __init__(self, run_dir, t0, every, budget):
        self.run_dir, self.t0, self.every, self.budget = run_dir, t0, every, budget
        self.count = tick_count(every, budget)
        self.next = 1
        os.makedirs(os.path.join(run_dir, "ticks"), exist_ok=True)

    def time_of(self, k):
        return self.t0 + k * self.every

    def due(self, now):
        """The ticks (k, instant) at or before now not yet written."""
        out = []
        k = self.next
        while k <= self.count and self.time_of(k) <= now:
            out.append((k, self.time_of(k)))
            k += 1
        return out

    def write(self, k, flat):
        if k != self.next:
            raise ValueError(f"tick {k} written out of order (expected {self.next})")
        save(tick_path(self.run_dir, k), flat)
        self.next = k + 1

    def finish(self, flat):
        """Ticks not yet written get `flat` (the model at the end), and it is final.npy."""
        while self.next <= self.count:
            self.write(self.next, flat)
        save(final_path(self.run_dir), flat)
