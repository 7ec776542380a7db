"""ashl: data-parallel training across workers of very different speed.

The runtime (parameter-server workers and servers over UCX, or in one process
over an in-process fabric), the job's runtime contract, ashl-run, and the
PyTorch adapter ``ashl.torch`` (imported on first use, so ``import ashl``
works without torch). docs/torch.md has the whole story.

    import ashl
    job = ashl.job()                      # ASHL_ROLE, ASHL_RANK, ... as set by ashl-run (or torchrun's, SLURM's)
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
           "launcher_flags", "policy_help", "has_ucx", "torch", "trace"]


def _plan_class():
    """Plan's fields are worker_plan's (core/plan.hpp, worker_plan::fields()),
    read from the native module's table, so the two cannot drift."""
    defaults = _ashl.plan_defaults()
    fields = [(name, type(defaults[name]), dataclasses.field(default=defaults[name]))
              for name, _help in _ashl.plan_fields()]

    def commit_interval(self) -> float:
        """Seconds between commits (ADSP); 0: commit by iterations."""
        return self.commit_interval_us * 1e-6

    def from_dict(d: Mapping[str, Any]) -> "Plan":
        return Plan(**d)

    doc = "What the servers told a worker to do (core/plan.hpp, worker_plan):\n" + "\n".join(
        f"    {name}: {help_}" for name, help_ in _ashl.plan_fields())
    cls = dataclasses.make_dataclass(
        "Plan", fields, frozen=True,
        namespace={"__doc__": doc, "commit_interval": property(commit_interval),
                   "from_dict": staticmethod(from_dict)})
    cls.__module__ = __name__
    return cls


Plan = _plan_class()


@dataclasses.dataclass(frozen=True)
class Job:
    """The runtime contract of one process (ps/launch.hpp): who it is and where the servers are."""
    role: str = "worker"
    rank: int = 0
    num_workers: int = 1           # the initial workers, ranks 0..num_workers-1
    max_workers: int = 0           # ASHL_MAX_WORKERS: the job's maximum (0 = num_workers); part of the job id
    num_servers: int = 1
    server_addresses: tuple = ()
    backup_addresses: tuple = ()   # ASHL_BACKUP_ADDR: shard i's backup ("" none); () no backups (docs/elastic.md §4.6)
    replica: bool = False          # ASHL_REPLICA: this server is its shard's backup
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
        d["backup_addresses"] = tuple(d.get("backup_addresses", ()))
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


DEFAULT_SERVER_PORT_OFFSET = 1  # torchrun/SLURM: server i listens at MASTER_PORT + 1 + i


def _first_host(nodelist: str) -> str:
    """The first host of a SLURM node list: "node[03-05,7],gpu1" -> "node03"."""
    head = ""
    depth = 0
    for c in nodelist:
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif c == "," and depth == 0:
            break
        head += c
    if "[" not in head:
        return head
    prefix, _, rng = head.partition("[")
    first = rng.rstrip("]").split(",")[0].split("-")[0]
    return prefix + first


def launcher_flags(env: Optional[Mapping[str, str]] = None) -> tuple:
    """The runtime contract a foreign launcher implies, as (flags, source):
    ``source`` is "ashl" (ASHL_ROLE is set: nothing derived), "torchrun"
    (RANK and WORLD_SIZE), "slurm" (SLURM_PROCID and SLURM_NTASKS) or "none".

    The mapping (docs/torch.md, "Launching"): of the launcher's WORLD_SIZE
    processes, the first S = ASHL_NUM_SERVERS (default 1) are servers (server
    rank = RANK) and the others workers (worker rank = RANK - S, num_workers =
    WORLD_SIZE - S). Server i listens at ASHL_SERVER_ADDR's address when set,
    else at MASTER_ADDR:MASTER_PORT + 1 + i (torchrun's store keeps
    MASTER_PORT itself); under SLURM without MASTER_ADDR the host is the
    first of SLURM_STEP_NODELIST (or SLURM_JOB_NODELIST) and the port
    MASTER_PORT or 29500. So the S servers must run on that host: the first
    ranks of torchrun's node 0, srun's first tasks (block distribution).
    The token is ASHL_TOKEN (or ASHL_INSECURE=1), from the environment only."""
    env = os.environ if env is None else env
    if env.get("ASHL_ROLE"):
        return [], "ashl"
    if env.get("RANK") and env.get("WORLD_SIZE"):
        rank_var, world_var, source = "RANK", "WORLD_SIZE", "torchrun"
    elif env.get("SLURM_PROCID") and env.get("SLURM_NTASKS"):
        rank_var, world_var, source = "SLURM_PROCID", "SLURM_NTASKS", "slurm"
    else:
        return [], "none"

    def count(var: str, most: int, bound: str) -> int:
        try:
            v = int(env[var])
        except ValueError:
            raise ValueError(f"{var} = '{env[var]}': expected a non-negative integer") from None
        if v < 0:
            raise ValueError(f"{var} = '{env[var]}': expected a non-negative integer")
        if v > most:  # before anything is sized by it (a list of addresses, below)
            raise ValueError(f"{var} = '{env[var]}': must be at most {most} ({bound})")
        return v

    # A process count bounds its ranks: at most every server and worker of a job.
    most_processes = _ashl.MAX_WORKERS + _ashl.MAX_SERVERS
    rank = count(rank_var, most_processes - 1, "ps::max_workers + ps::max_servers - 1")
    world = count(world_var, most_processes, "ps::max_workers + ps::max_servers")
    servers = (count("ASHL_NUM_SERVERS", _ashl.MAX_SERVERS, "ps::max_servers")
               if env.get("ASHL_NUM_SERVERS") else 1)
    if servers < 1:
        raise ValueError(f"ASHL_NUM_SERVERS = '{servers}': must be >= 1")
    if world <= servers:
        raise ValueError(f"{world_var} = '{world}': must be more than ASHL_NUM_SERVERS ({servers}): "
                         "the first ranks are servers, the others workers")
    if rank >= world:
        raise ValueError(f"{rank_var} = '{rank}': must be < {world_var} ({world})")
    flags = ["--num-servers", str(servers), "--num-workers", str(world - servers)]
    if rank < servers:
        flags += ["--role", "server", "--rank", str(rank)]
    else:
        flags += ["--role", "worker", "--rank", str(rank - servers)]
    if not env.get("ASHL_SERVER_ADDR"):
        host = env.get("MASTER_ADDR")
        if not host and source == "slurm":
            nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
            host = _first_host(nodes) if nodes else None
        if not host:
            raise ValueError(f"MASTER_ADDR is not set: {source} needs it (or ASHL_SERVER_ADDR) to find server 0")
        base = count("MASTER_PORT", 65535, "a TCP port") if env.get("MASTER_PORT") else 29500
        addrs = [f"{host}:{base + DEFAULT_SERVER_PORT_OFFSET + i}" for i in range(servers)]
        flags += ["--server-addr", ",".join(addrs)]
    return flags, source


def job(argv: Optional[Sequence[str]] = None) -> Job:
    """This process's runtime contract from ASHL_ROLE, ASHL_RANK, ASHL_NUM_WORKERS,
    ASHL_MAX_WORKERS, ASHL_NUM_SERVERS, ASHL_SERVER_ADDR, ASHL_TOKEN (or ASHL_INSECURE) as ashl-run
    sets them, or, without ASHL_ROLE, from torchrun's (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) or SLURM's (SLURM_PROCID, SLURM_NTASKS,
    SLURM_STEP_NODELIST) variables (``launcher_flags``); flags in ``argv``
    (``--role`` ...) win. Raises ValueError naming the variable and its bad value.

    The token is read from ASHL_TOKEN only (``--token`` is refused: a command
    line is visible to every user in ps(1)), must have at least 16 bytes
    unless insecure, and is then removed from this process's environment
    (os.environ and the C environment), so programs it starts (data loaders,
    shells, subprocess.run) do not inherit it; later calls of job() in this
    process use the token the first one read."""
    global _consumed_token
    derived, _ = launcher_flags()
    args = ["python"] + derived + list(argv if argv is not None else [])
    fresh = os.environ.get("ASHL_TOKEN")
    if fresh is not None:
        _consumed_token = fresh
    elif _consumed_token is not None:
        os.environ["ASHL_TOKEN"] = _consumed_token  # for the parser only, removed again below
    try:
        return Job.from_dict(_ashl.job_from(args))
    finally:
        os.environ.pop("ASHL_TOKEN", None)  # the native parser unset it in the C environment; os.environ too


_consumed_token: Optional[str] = None  # ASHL_TOKEN as job() read it, once removed from the environment


def ashl_run_path() -> str:
    """The ashl-run executable: ASHL_RUN when set, else the one inside this
    package (pip install), else ashl-run on PATH."""
    env = os.environ.get("ASHL_RUN")
    if env:
        return env
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "ashl-run")
    if os.access(here, os.X_OK):
        return here
    # On PATH, pip's console script ashl-run (ashl.run:main) comes first
    # when the package was installed without the native one: skip it, or
    # it would start itself again and again.
    for d in os.environ.get("PATH", "").split(os.pathsep):
        found = shutil.which("ashl-run", path=d) if d else None
        if found and not _is_console_script(found):
            return found
    raise FileNotFoundError("ashl-run: the native one is not in this package, not in ASHL_RUN, not on PATH "
                            "(the console script ashl-run needs it: build the ashl_run target)")


def _is_console_script(path: str) -> bool:
    """Whether ``path`` is the console script pip made from ashl.run:main (a
    Python script), not the native ashl-run (an executable)."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return head.startswith(b"#!") and b"ashl.run" in head


def run(command: Sequence[str], servers: int = 1, workers: int = 1, *, addr: Optional[str] = None,
        token: Optional[str] = None, insecure: bool = False, timeout: Optional[float] = None,
        grace: Optional[float] = None, verbose: bool = False, check: bool = True, trace: Optional[str] = None,
        ports_per_server: Optional[int] = None, max_workers: Optional[int] = None,
        **popen: Any) -> subprocess.CompletedProcess:
    """Starts one job on this machine through ashl-run: ``servers`` servers and
    ``workers`` workers of ``command``, each with the runtime contract in its
    environment. Blocks until the job ends; returns the CompletedProcess
    (raises CalledProcessError when a process failed and ``check``). Pass
    ``sys.executable`` as the program to run Python scripts with this interpreter.
    ``token`` goes to the processes through ASHL_TOKEN, not a command line
    (at least 16 bytes, else ashl-run refuses it; unset: ASHL_TOKEN, else a random one).
    ``trace``: every worker writes a Chrome trace (ASHL_TRACE) and they are
    merged into this path when the job ends (ashl.trace). ``ports_per_server``:
    the ports ashl-run reserves per server (its default, 16), the bound on
    ashl.torch's buckets. ``max_workers``: the job's maximum (ashl-run
    --max-workers, ASHL_MAX_WORKERS): workers of rank ``workers`` ..
    ``max_workers - 1`` started later with the same contract join it."""
    if not command:
        raise ValueError("command = []: needs the program to run")
    args = [ashl_run_path(), "-s", str(servers), "-w", str(workers)]
    if addr:
        args += ["--addr", addr]
    if ports_per_server is not None:
        args += ["--ports-per-server", str(ports_per_server)]
    if max_workers is not None:
        args += ["--max-workers", str(max_workers)]
    if insecure:
        args.append("--insecure")
    if timeout is not None:
        args += ["--timeout", str(timeout)]
    if grace is not None:
        args += ["--grace", str(grace)]
    if verbose:
        args.append("--verbose")
    if trace:  # ashl-run gives every process ASHL_TRACE and merges their files when the job ends
        args += ["--trace", os.path.abspath(trace)]
    args += ["--"] + [str(c) for c in command]
    if token:  # through the environment, never on a command line (ps(1) shows those)
        popen["env"] = dict(popen.get("env") or os.environ, ASHL_TOKEN=token)
    return subprocess.run(args, check=check, **popen)


_run_function = run  # ashl.run the function, also when the module ashl.run (python -m ashl.run) was imported


def __getattr__(name: str):
    if name == "torch":  # the adapter needs torch: imported on first use
        return importlib.import_module(".torch", __name__)
    if name == "trace":
        return importlib.import_module(".trace", __name__)
    raise AttributeError(f"module 'ashl' has no attribute {name!r}")
