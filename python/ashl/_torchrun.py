"""The torchrun drop-in's runtime contract (docs/torch.md, "From DDP to ashl").

Under ``DistributedOptimizer(..., start_servers=True)`` every process torchrun
starts is a worker (worker rank = RANK, workers = WORLD_SIZE, as DDP's ranks)
and the process of RANK 0 runs the job's servers too, in threads
(``ashl.torch.serve(background=True)``). This module derives both sides'
``ashl.Job`` from torchrun's variables, and the job's token:

- ``ASHL_TOKEN`` when set (every node's environment; at least 16 bytes), or
  ``ASHL_INSECURE=1``;
- else, when the whole job is on one node (LOCAL_WORLD_SIZE == WORLD_SIZE),
  RANK 0 makes a random one (``secrets.token_hex(32)``) and hands it to the
  other ranks in a file of mode 0600 in a directory of mode 0700 that this
  user owns (``$XDG_RUNTIME_DIR/ashl-<uid>``, else ``<tmp>/ashl-<uid>``),
  named after torchrun's run (TORCHELASTIC_RUN_ID, or the agent's pid,
  MASTER_PORT, TORCHELASTIC_RESTART_COUNT); RANK 0 removes it when it ends;
- else (several nodes, no token) the job is refused naming ASHL_TOKEN.

Threat model: the token keeps other users' processes on the host and anyone
on the network away from the servers (a single-node job also listens on
127.0.0.1 only); it does not keep out processes of the same user, which can
read the file as they can read the training processes' memory.

Needs no torch: the job is plain data (ashl.Job).
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import stat
import tempfile
import time
from typing import List, Mapping, Optional, Tuple

from . import Job, DEFAULT_SERVER_PORT_OFFSET
from . import _ashl

TOKEN_WAIT_SECONDS = 60.0  # how long a rank waits for RANK 0's token file


def _int(env: Mapping[str, str], var: str, default: Optional[int] = None) -> int:
    raw = env.get(var)
    if raw is None or raw == "":
        if default is None:
            raise ValueError(f"{var} is not set: start_servers=True runs under torchrun "
                             "(torchrun --nproc-per-node N train.py sets RANK, WORLD_SIZE, ...)")
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ValueError(f"{var} = '{raw}': expected a non-negative integer") from None
    if v < 0:
        raise ValueError(f"{var} = '{raw}': expected a non-negative integer")
    return v


@dataclasses.dataclass(frozen=True)
class Contract:
    """What one torchrun process is under the drop-in."""
    worker: Job                 # this process's worker (rank = RANK)
    servers: Tuple[Job, ...]    # the servers this process runs: all S on RANK 0, none elsewhere
    token_file: Optional[str]   # the token file RANK 0 made (removed when it ends), else None
    single_node: bool


def token_dir() -> str:
    """The per-user directory of token files, made 0700 when missing; one
    that another user owns, a link, or one others may read is refused."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    d = os.path.join(base, f"ashl-{os.getuid()}")
    try:
        os.mkdir(d, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise PermissionError(f"token directory {d}: must be a directory of uid {os.getuid()} with mode 0700 "
                              f"(it is mode {oct(stat.S_IMODE(st.st_mode))}, uid {st.st_uid}, "
                              f"{'a directory' if stat.S_ISDIR(st.st_mode) else 'not a directory'}); "
                              "remove it, or set ASHL_TOKEN")
    return d


def token_path(env: Mapping[str, str]) -> str:
    """Where RANK 0 leaves the token for this torchrun run (every local rank
    computes the same name; a restarted group gets another one)."""
    run = env.get("TORCHELASTIC_RUN_ID", "")
    key = run if run and run != "none" else f"agent{os.getppid()}"
    key = "".join(c if c.isalnum() or c in "-_" else "_" for c in key)
    port = env.get("MASTER_PORT", "0")
    restart = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return os.path.join(token_dir(), f"torchrun-{key}-{port}-{restart}.token")


def write_token(path: str, token: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        os.write(fd, token.encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)  # the readers see the whole token or no file


def read_token(path: str, wait: float = TOKEN_WAIT_SECONDS) -> str:
    """RANK 0's token from ``path``, waiting up to ``wait`` seconds for it;
    a file that is not this user's, or that others may read, is refused."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            break
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"token file {path}: not written by RANK 0 within {wait:g} s "
                                   "(is RANK 0 of this torchrun job on this node? set ASHL_TOKEN otherwise)") from None
            time.sleep(0.05)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise PermissionError(f"token file {path}: mode {oct(stat.S_IMODE(st.st_mode))}, uid {st.st_uid}: "
                                  f"must be 0600 and uid {os.getuid()}")
        token = os.read(fd, 4096).decode()
    finally:
        os.close(fd)
    return token


def contract(env: Optional[Mapping[str, str]] = None) -> Contract:
    """This process's worker job (and, on RANK 0, its servers' jobs) from
    torchrun's variables; RANK 0 writes the token file when it makes the
    token. Raises ValueError naming the variable that is missing or bad."""
    env = dict(os.environ if env is None else env)
    if env.get("ASHL_ROLE"):
        raise ValueError(f"ASHL_ROLE = '{env['ASHL_ROLE']}': start_servers=True starts its own servers under "
                         "torchrun; under ashl-run the servers are its processes (ashl.torch.serve)")
    rank = _int(env, "RANK")
    world = _int(env, "WORLD_SIZE")
    if world < 1 or rank >= world:
        raise ValueError(f"RANK = '{rank}': must be < WORLD_SIZE ({world})")
    local_world = _int(env, "LOCAL_WORLD_SIZE", world)
    single_node = local_world == world
    servers = _int(env, "ASHL_NUM_SERVERS", 1)
    if servers < 1:
        raise ValueError(f"ASHL_NUM_SERVERS = '{servers}': must be >= 1")
    if env.get("ASHL_SERVER_ADDR"):
        addrs = [a.strip() for a in env["ASHL_SERVER_ADDR"].split(",") if a.strip()]
        if len(addrs) != servers:
            raise ValueError(f"ASHL_SERVER_ADDR = '{env['ASHL_SERVER_ADDR']}': names {len(addrs)} servers, "
                             f"ASHL_NUM_SERVERS is {servers}")
    else:
        # One node: the servers listen on the loopback only. Several: on
        # MASTER_ADDR (RANK 0's host), the ports after torchrun's store.
        host = "127.0.0.1" if single_node else env.get("MASTER_ADDR")
        if not host:
            raise ValueError("MASTER_ADDR is not set: torchrun sets it; or set ASHL_SERVER_ADDR")
        base = _int(env, "MASTER_PORT", 29500)
        addrs = [f"{host}:{base + DEFAULT_SERVER_PORT_OFFSET + i}" for i in range(servers)]
    insecure = env.get("ASHL_INSECURE", "") not in ("", "0")
    token = "" if insecure else env.get("ASHL_TOKEN", "")
    token_file = None
    if not insecure and not token:
        if not single_node:
            raise ValueError(f"ASHL_TOKEN is not set: a job over several nodes (WORLD_SIZE {world}, "
                             f"LOCAL_WORLD_SIZE {local_world}) needs the same token in every node's environment "
                             "(export ASHL_TOKEN=$(openssl rand -hex 16)), or ASHL_INSECURE=1 on a trusted network")
        path = token_path(env)
        if rank == 0:
            token = secrets.token_hex(32)
            write_token(path, token)
            token_file = path
        else:
            token = read_token(path)
    args = ["python", "--role", "worker", "--rank", str(rank), "--num-workers", str(world),
            "--num-servers", str(servers), "--server-addr", ",".join(addrs)]
    if insecure:
        args.append("--insecure")
    worker = _job_with_token(args, token)
    server_jobs = tuple(dataclasses.replace(worker, role="server", rank=i) for i in range(servers)) \
        if rank == 0 else ()
    return Contract(worker=worker, servers=server_jobs, token_file=token_file, single_node=single_node)


def _job_with_token(args: List[str], token: str) -> Job:
    """ashl's own parser (ps/launch.hpp) on ``args`` with ``token`` as
    ASHL_TOKEN, which is then gone from the environment again (os.environ
    and the C environment), so programs this one starts do not inherit it."""
    saved = {k: os.environ.pop(k) for k in ("ASHL_ROLE", "ASHL_TOKEN") if k in os.environ}
    saved.pop("ASHL_TOKEN", None)
    try:
        if token:
            os.environ["ASHL_TOKEN"] = token
        return Job.from_dict(_ashl.job_from(args))
    finally:
        os.environ.pop("ASHL_TOKEN", None)
        os.environ.update(saved)
