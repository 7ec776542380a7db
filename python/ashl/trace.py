"""ashl.trace: a Chrome trace of one process (chrome://tracing, Perfetto),
like Horovod's timeline: where a step's time goes, per bucket.

    ASHL_TRACE=/tmp/run.json python3 -m ashl.run -w 4 -- python3 train.py   # or --trace /tmp/run.json

Each worker writes ``<path>.worker<rank>.json`` when it leaves; the launcher
(``ashl-run``, ``python -m ashl.run``) merges them into ``<path>`` (one
process row per worker). The C++ adapter (adapt/torch.hpp) writes the same
events (adapt/trace.hpp). Events ("ph": "X", microseconds since the epoch, so files of one
host line up):

- ``compute`` (thread "train"): from the end of one ``step()`` to the start
  of the next: forward, backward, the loss, data loading;
- ``encode`` (thread "train"): building a bucket's update (the copy out of
  the gradient bucket, the delta, the mean, 16-bit or device staging);
- ``commit`` (thread "comm"): ps::worker::commit of a bucket (encoding with
  the plan's codec, an emulated link's upload hold, the send);
- ``pull`` (thread "pull"): ps::worker::wait of a bucket, until its
  parameters arrived (and an emulated link's download hold);
- ``wait`` (thread "train"): the training thread blocked on a bucket's pull
  (a forward pre-hook, or step()).

Every event has ``args.bucket`` where it concerns one bucket.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import List, Optional

__all__ = ["Tracer", "merge", "path_of"]


def path_of(trace: Optional[str], role: str, rank: int) -> Optional[str]:
    """This process's file for a job-wide trace path (None: no trace)."""
    trace = trace if trace is not None else os.environ.get("ASHL_TRACE") or None
    if not trace:
        return None
    return f"{trace}.{role}{rank}.json"


class Tracer:
    """Collects complete events in memory (a lock, one tuple each) and
    writes them once, at close()."""

    def __init__(self, path: Optional[str], role: str = "worker", rank: int = 0):
        self.path = path
        self.pid = rank if role == "worker" else 100000 + rank
        self.name = f"{role} {rank}"
        self._events: List[dict] = []
        self._lock = threading.Lock()
        self._tids = {"train": 1, "comm": 2, "pull": 3}

    @property
    def enabled(self) -> bool:
        return self.path is not None

    @staticmethod
    def now() -> float:
        return time.time() * 1e6

    def span(self, name: str, thread: str, start_us: float, end_us: float, bucket: Optional[int] = None) -> None:
        if self.path is None:
            return
        e = {"name": name, "ph": "X", "ts": start_us, "dur": max(0.0, end_us - start_us), "pid": self.pid,
             "tid": self._tids.get(thread, 4), "cat": "ashl"}
        if bucket is not None:
            e["args"] = {"bucket": bucket}
        with self._lock:
            self._events.append(e)

    def close(self) -> None:
        if self.path is None:
            return
        meta = [{"name": "process_name", "ph": "M", "pid": self.pid, "args": {"name": self.name}}]
        meta += [{"name": "thread_name", "ph": "M", "pid": self.pid, "tid": t, "args": {"name": n}}
                 for n, t in self._tids.items()]
        with self._lock:
            events = meta + self._events
            self._events = []
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
        os.replace(tmp, self.path)
        self.path = None


def merge(path: str) -> int:
    """Merges ``<path>.*.json`` (one per process) into ``<path>``; returns
    the number of files merged (0: none, ``path`` not written; the
    per-process files are kept). ashl-run does this when a job with
    ``--trace`` ends; this is the same code (adapt::merge_traces), for
    files gathered by hand, e.g. from several hosts."""
    from . import _ashl
    return _ashl.merge_traces(os.fspath(path))
