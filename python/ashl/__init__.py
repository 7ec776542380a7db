"""ashl: data-parallel training across workers of very different speed.

The runtime (parameter-server workers and servers over UCX, or in one process
over an in-process fabric), the job's runtime contract, ashl-run, and the
PyTorch adapter ``ashl.torch`` (imported on first use, so ``import ashl``
works without torch). docs/torch.md has the whole story.

    import ashl
    job = ashl.job()                      # ASHL_ROLE, ASHL_RANK, ... as set by ashl-run
    ashl.run(["python3", "train.py"], servers=1, workers=2)   # starts a job on this machine
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import subprocess
import sys
from typing import Any, Mapping, Optional, Sequence

from ._ashl import InprocFabric, Server, Worker, has_ucx, policy_help  # noqa: F401
from . import _ashl

__all__ = ["Job", "Plan", "Policy", "InprocFabric", "Server", "Worker", "job", "run", "ashl_run_path",
           "policy_help", "has_ucx", "torch"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the servers told a worker to do (core/plan.hpp, worker_plan)."""
    local_iterations: int = 1      # local steps per commit; 0: commit by interval
    commit_interval: float = 0.0   # seconds between commits (ADSP); 0: by iterations
    batch_size: int = 0            # 0: the worker's own
    stage: str = "none"            # bsp, ssp, profile, ahl, shl, adsp, dlb, ...
    data_share: float = 0.0        # fraction of the training data; 0: unspecified
    compression_ratio: float = 1.0  # fraction of the update kept

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Plan":
        return Plan(**d)


@dataclasses.dataclass(frozen=True)
class Job:
    """The runtime contract of one process (ps/launch.hpp): who it is and where the servers are."""
    role: str = "worker"
    rank: int = 0
    num_workers: int = 1
    num_servers: int = 1
    server_addresses: tuple = ()
    token: str = dataclasses.field(default="", repr=False)
    insecure: bool = False
    verbose: bool = False
    progress_seconds: float = 0.0
    name: str = ""                 # ASHL_JOB: part of the job id (ashl._ashl.make_job_id)
    no_worker_grace: float = 60.0  # ASHL_NO_WORKER_GRACE: a server ends after this long with no worker
    rest: tuple = ()

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> "Job":
        d = dict(d)
        d["server_addresses"] = tuple(d["server_addresses"])
        d["rest"] = tuple(d["rest"])
        return Job(**d)


@dataclasses.dataclass(frozen=True)
class Policy:
    """A consistency policy by name with its parameters (ps::policy_params fields; ashl.policy_help())."""
    name: str = "bsp"
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __init__(self, name: str = "bsp", **params: Any):
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "params", dict(params))

    @staticmethod
    def of(p: "Policy | str | None") -> "Policy":
        if p is None:
            return Policy("bsp")
        if isinstance(p, Policy):
            return p
        if isinstance(p, str):
            return Policy(p)
        raise TypeError(f"policy = {p!r}: must be a policy name (str) or ashl.Policy")


def job(argv: Optional[Sequence[str]] = None) -> Job:
    """This process's runtime contract from ASHL_ROLE, ASHL_RANK, ASHL_NUM_WORKERS,
    ASHL_NUM_SERVERS, ASHL_SERVER_ADDR, ASHL_TOKEN (or ASHL_INSECURE) as ashl-run
    sets them; flags in ``argv`` (``--role`` ...) win. Raises ValueError naming
    the variable and its bad value."""
    args = ["python"] + list(argv if argv is not None else [])
    return Job.from_dict(_ashl.job_from(args))


def ashl_run_path() -> str:
    """The ashl-run executable: ASHL_RUN when set, else the one inside this
    package (pip install), else ashl-run on PATH."""
    env = os.environ.get("ASHL_RUN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ashl-run")
    if os.access(here, os.X_OK):
        return here
    found = shutil.which("ashl-run")
    if found:
        return found
    raise FileNotFoundError("ashl-run: not in this package, not in ASHL_RUN, not on PATH")


def run(command: Sequence[str], servers: int = 1, workers: int = 1, *, addr: Optional[str] = None,
        token: Optional[str] = None, insecure: bool = False, timeout: Optional[float] = None,
        grace: Optional[float] = None, verbose: bool = False, check: bool = True,
        **popen: Any) -> subprocess.CompletedProcess:
    """Starts one job on this machine through ashl-run: ``servers`` servers and
    ``workers`` workers of ``command``, each with the runtime contract in its
    environment. Blocks until the job ends; returns the CompletedProcess
    (raises CalledProcessError when a process failed and ``check``). Pass
    ``sys.executable`` as the program to run Python scripts with this interpreter."""
    if not command:
        raise ValueError("command = []: needs the program to run")
    args = [ashl_run_path(), "-s", str(servers), "-w", str(workers)]
    if addr:
        args += ["--addr", addr]
    if token:
        args += ["--token", token]
    if insecure:
        args.append("--insecure")
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    if grace is not None:
        args += ["--grace", str(grace)]
    if verbose:
        args.append("--verbose")
    args += ["--"] + [str(c) for c in command]
    return subprocess.run(args, check=check, **popen)


def __getattr__(name: str):
    if name == "torch":  # the adapter needs torch: imported on first use
        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'ashl' has no attribute {name!r}")
