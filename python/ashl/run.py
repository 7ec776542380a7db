"""python3 -m ashl.run (or ashl-run, the console script pip installs): starts one job on this machine.

    python3 -m ashl.run -s 1 -w 4 [--trace out.json] [--timeout S] [--insecure] -- python3 train.py
    ashl-run -s 1 -w 4 -- python3 train.py

It runs the native ashl-run (tools/ashl-run: the one inside the package,
ASHL_RUN, or on PATH; ashl.ashl_run_path()).

The token is ASHL_TOKEN of this environment (ashl-run makes a random one
when it is unset); there is no --token flag, so it never appears on a
command line. ``--trace PATH`` (or ASHL_TRACE=PATH) makes every worker write
a Chrome trace and merges them into PATH when the job ends (ashl.trace).
Exits with ashl-run's status. On several hosts use torchrun or srun instead
(ashl.job() reads their variables; docs/torch.md, "Launching").
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from typing import List, Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        ours, command = argv[:i], argv[i + 1:]
    else:
        ours, command = argv, []
    ap = argparse.ArgumentParser(prog=_prog(), description=__doc__.split("\n\n")[0])
    ap.add_argument("-s", "--servers", type=int, default=1)
    ap.add_argument("-w", "--workers", type=int, default=1)
    ap.add_argument("--max-workers", type=int, default=None,
                    help="the most workers the job may have (ASHL_MAX_WORKERS; default: -w)")
    ap.add_argument("--addr", default=None, help="server 0's HOST:PORT (server i: port + i)")
    ap.add_argument("--ports-per-server", type=int, default=None,
                    help="ports reserved per server (default 16): the bound on ashl.torch's buckets")
    ap.add_argument("--insecure", action="store_true", help="no token")
    ap.add_argument("--timeout", type=float, default=None)
    ap.add_argument("--grace", type=float, default=None)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument("--trace", default=os.environ.get("ASHL_TRACE") or None,
                    help="merged Chrome trace of the workers (default: ASHL_TRACE)")
    a, extra = ap.parse_known_args(ours)
    if any(x == "--token" or x.startswith("--token=") for x in extra):
        ap.error("--token: pass the token in ASHL_TOKEN (a command line is visible to every user in ps(1))")
    command = extra + command
    if not command:
        ap.error("the program to run goes after --")
    from . import _run_function as run_job
    done = run_job(command, servers=a.servers, workers=a.workers, addr=a.addr, insecure=a.insecure,
                   timeout=a.timeout, grace=a.grace, verbose=a.verbose, check=False, trace=a.trace,
                    ports_per_server=a.ports_per_server, max_workers=a.max_workers)
    return done.returncode


def _prog() -> str:
    # "ashl-run" when started as pip's console script, else python3 -m ashl.run.
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return name if name.startswith("ashl-run") else "python3 -m ashl.run"


class _CallableModule(types.ModuleType):
    # ``import ashl.run`` binds this module to the package's name ``run``,
    # where the function ashl.run(...) lives: calling the module calls it.
    def __call__(self, *args, **kwargs) -> subprocess.CompletedProcess:
        from . import _run_function
        return _run_function(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
