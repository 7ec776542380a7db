"""ashl.torch: PyTorch training under ashl's parameter servers, one changed line.

    import torch, ashl
    model = Net()
    job = ashl.job()                                    # ashl-run's, torchrun's or SLURM's variables
    if job.role == "server":
        ashl.torch.serve(model, job, policy="bsp", compression="topk", optimizer="sgd")  # until every worker left
    else:
        opt = ashl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model,
                                              policy="bsp", compression="topk", update="gradient")
        for x, y in loader:                             # opt.batch_size: the plan's batch
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()                             # full buckets are committed while backward runs
            opt.step()                                  # the rest; pulls are waited for in the next forward
        opt.leave()

and ``python3 -m ashl.run -s 1 -w 4 -- python3 train.py`` starts the job.

Under torchrun a DDP script need not branch on roles:
``DistributedOptimizer(opt, model, start_servers=True)`` makes every rank a
worker and RANK 0 run the servers too, ``DistributedSampler`` follows the
plan's data share and batch size, and the worker leaves at exit
(docs/torch.md, "From DDP to ashl"; examples/torchrun).

The model's parameters and gradients are flattened into buckets (default
"auto": DDP's 25 MiB, at most a quarter of a smaller model; reverse
registration order; one dtype and device each; a parameter over 4 MiB cut
across several, BytePS's partitioning): every parameter's .data and .grad
are views into one flat storage per dtype and device, laid out in bucket
order. Each bucket is one
parameter-server tensor: its own ps::worker, served by its own ps::server
in each server process (docs/torch.md, "Buckets and overlap"). A gradient
hook marks a parameter ready; a full bucket's update is built (the shared
adapt::update_builder) and committed by a communication thread while
backward continues; its pull is waited for by a forward pre-hook of the
first module that uses it. include/ashl/adapt/torch.hpp is the C++ side.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import math
import os
import sys
import warnings
import weakref
from time import monotonic as time_monotonic, sleep as time_sleep
import queue
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from . import Job, Plan, Policy, _ashl
from . import job as _job_from_env
from . import _torchrun
from .trace import Tracer, path_of

__all__ = ["Bucket", "DistributedOptimizer", "DistributedSampler", "StreamingDiLoCo", "layer_fragment_sizes", "serve",
           "partition", "bucket_plan", "bucket_addresses", "bucket_cap_bytes",
           "DEFAULT_PARTITION_MB",
           "ADAPTIVE_POLICIES", "DILOCO_POLICIES"]

# The plan stages each policy's servers send (core/plan.hpp, stage_id): a
# worker whose servers run another policy than it was told fails at once.
_STAGES = {
    "bsp": {"bsp"}, "asp": {"asp"}, "ssp": {"ssp"}, "local_sgd": {"local_sgd"}, "dssp": {"dssp"},
    "semi_async": {"semi_async"}, "adsp": {"adsp"}, "ashl": {"profile", "ahl", "shl"}, "dlb": {"dlb"},
    # The DiLoCo family runs these policies with the outer optimizer.
    "diloco": {"local_sgd"}, "async_diloco": {"asp"}, "async_local_sgd": {"asp"},
    "ashl_diloco": {"profile", "ahl", "shl"},
}

# The DiLoCo family (docs/algorithms.md "The DiLoCo family"): one name sets
# the policy and the servers' outer optimizer; these keyword arguments of
# DistributedOptimizer and serve() set its parameters (ps::policy_params).
DILOCO_POLICIES = frozenset({"diloco", "async_diloco", "async_local_sgd", "ashl_diloco"})
_OUTER_ARGS = ("outer_lr", "outer_momentum", "outer_nesterov", "outer_weight_decay", "outer_delay",
               "outer_activation")
# Policies whose plan is local_steps for every worker (a worker given
# local_steps checks the servers' plan).
_LOCAL_STEPS_POLICIES = frozenset({"local_sgd", "diloco", "async_diloco", "async_local_sgd"})

# Policies whose plans come from measurements (a planner). Their buckets
# run the cycle and plans of the first bucket's worker (a ps::worker
# follower each; docs/torch.md, "Buckets and overlap"), as every bucket does.
ADAPTIVE_POLICIES = frozenset({"ashl", "adsp", "dlb", "joint", "ashl_diloco"})

# Policies whose planners read the training loss (report_metric("loss")):
# by name, or by the stage the servers send when no policy was given.
_LOSS_POLICIES = frozenset({"ashl", "adsp", "joint", "ashl_diloco"})
_LOSS_STAGES = frozenset({"adsp", "profile", "ahl", "shl"})

# The DistributedOptimizer made last in this process: the one a
# DistributedSampler follows when it is given none.
_current: Optional[Callable[[], Optional["DistributedOptimizer"]]] = None

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}

# What the bucket cycle (rules/bucket_cycle.hpp) asks of a bucket.
_ACTION = _ashl.BucketCycle.Action
_COUNT = _ashl.BucketCycle.Count

# The default bucket size ("auto", docs/perf/torch.md "Bucket size"): DDP's
# 25 MiB for a large model, but at least MIN_BUCKETS buckets' worth for a
# smaller one (a quarter of the model), never below MIN_BUCKET_CAP_MB: the
# rule of adapt::bucket_cap_bytes (update_builder.hpp), which computes it.
DEFAULT_BUCKET_CAP_MB = 25.0
MIN_BUCKETS = 4
MIN_BUCKET_CAP_MB = 1.0


def bucket_cap_bytes(model_bytes: int, bucket_cap_mb: Union[float, str, None] = "auto") -> int:
    """The bucket cap in bytes for a model of ``model_bytes`` (the parameters
    that own a slot, all dtypes). ``"auto"`` (the default):
    min(25 MiB, max(1 MiB, model_bytes / 4)), so that a model under 100 MiB
    still makes about four buckets and its last-computed gradients do not
    share one bucket with half the model (docs/perf/torch.md, "Bucket
    size": on a 42 MB model 10 MiB buckets hid 73-79 % of the exchange and
    gave 1.43-1.46x, 25 MiB 5-42 % and 1.02-1.24x). A number: that many MiB;
    None or 0: 0 (one bucket per dtype and device)."""
    if isinstance(bucket_cap_mb, str):
        if bucket_cap_mb != "auto":
            raise ValueError(f"bucket_cap_mb = {bucket_cap_mb!r}: must be a number of MiB, 0, None or 'auto'")
        return _ashl.bucket_cap_bytes(int(model_bytes), None)  # adapt::bucket_cap_bytes, the C++ adapter's rule
    if not bucket_cap_mb:
        return 0
    if bucket_cap_mb < 0:
        raise ValueError(f"bucket_cap_mb = {bucket_cap_mb}: must be >= 0")
    return _ashl.bucket_cap_bytes(int(model_bytes), float(bucket_cap_mb))


def _codec_name(compression: Optional[str]) -> Optional[str]:
    if compression is None:
        return None
    if not isinstance(compression, str):
        raise TypeError(f"compression = {compression!r}: must be a codec name (str) or None")
    return "identity" if compression == "none" else compression


def _named_parameters(model: Any) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(model, torch.nn.Module):
        named = list(model.named_parameters(remove_duplicate=False)) if _has_remove_duplicate() \
            else list(model.named_parameters())
    else:
        named = [item if isinstance(item, tuple) else (str(i), item) for i, item in enumerate(model)]
    return [(n, p) for n, p in named if p.requires_grad]


def _has_remove_duplicate() -> bool:
    import inspect
    try:
        return "remove_duplicate" in inspect.signature(torch.nn.Module.named_parameters).parameters
    except (TypeError, ValueError):
        return False


def _named_parameters_unique(model: Any) -> List[Tuple[str, torch.Tensor]]:
    """The parameters that own a slot: tied ones once, at their first
    registration (adapt::first_registrations, the C++ adapter's rule)."""
    named = _named_parameters(model)
    own = _ashl.first_registrations([id(p) for _, p in named])
    return [item for item, o in zip(named, own) if o]


def _check(name: str, p: torch.Tensor) -> None:
    if p.dtype not in _DTYPES:
        raise ValueError(f"parameter '{name}'.dtype = {p.dtype}: must be torch.float32, torch.float16 or "
                         "torch.bfloat16")
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"parameter '{name}'.device = {p.device}: must be the CPU or a CUDA device")
    if not p.is_contiguous():
        raise ValueError(f"parameter '{name}'.stride = {tuple(p.stride())}: must be contiguous "
                         f"(shape {tuple(p.shape)}); call .contiguous() when building the model")


# The partition size (adapt::default_partition_mb, BytePS's 4 MB): a
# parameter larger than it is cut across consecutive buckets, its pieces
# committed and pulled as a pipeline (docs/torch.md, "Partitioning").
DEFAULT_PARTITION_MB = _ashl.DEFAULT_PARTITION_MB


def bucket_plan(model: Any, bucket_cap_mb: Union[float, str, None] = "auto",
                partition_mb: Optional[float] = DEFAULT_PARTITION_MB) -> List[List[Tuple[str, torch.Tensor, int, int]]]:
    """The buckets a worker and a server make of ``model`` (they must agree),
    as pieces ``(name, parameter, begin, size)``: elements [begin, begin +
    size) of the flattened parameter. adapt::plan_buckets computes it (the
    C++ adapter's rule): the parameters that own a slot, in reverse
    registration order, one dtype and device per bucket, at most
    ``bucket_cap_bytes(model bytes, bucket_cap_mb)`` each; a parameter of
    more than ``partition_mb`` MiB is cut into pieces of at most that size,
    each a bucket alone, in consecutive buckets (None: not cut); another
    parameter larger than the cap is alone. ``bucket_cap_mb`` None or 0: one
    bucket per dtype and device, nothing cut. ``partition_mb`` must be > 0
    (ValueError naming it)."""
    named = _named_parameters_unique(model)
    if not named:
        raise ValueError("model.parameters: none requires grad (nothing to train)")
    for n, p in named:
        _check(n, p)
    if partition_mb is not None and (isinstance(partition_mb, bool) or not isinstance(partition_mb, (int, float))):
        raise ValueError(f"partition_mb = {partition_mb!r}: must be a number of MiB > 0 or None (no partitioning)")
    keys = [f"{_DTYPES[p.dtype]}@{p.device}" for _, p in named]
    sizes = [p.numel() * p.element_size() for _, p in named]
    cap = bucket_cap_bytes(sum(sizes), bucket_cap_mb)
    plan = _ashl.plan_buckets(keys, sizes, [p.numel() for _, p in named], cap,
                              None if partition_mb is None else float(partition_mb))
    return [[(named[i][0], named[i][1], begin, size) for i, begin, size in b] for b in plan]


def partition(model: Any, bucket_cap_mb: Union[float, str, None] = "auto",
              policy: Union[Policy, str, None] = None) -> List[List[Tuple[str, torch.Tensor]]]:
    """The buckets of ``model`` without partitioning (``bucket_plan(model,
    bucket_cap_mb, None)``): per bucket its (name, parameter) pairs, a
    parameter larger than the cap alone. ``policy`` does not change the
    buckets (it did before adaptive policies overlapped; kept for callers)."""
    del policy
    return [[(n, p) for n, p, _, _ in b] for b in bucket_plan(model, bucket_cap_mb, None)]


def _alias(plan: List[List[Tuple[str, torch.Tensor, int, int]]]) -> List[Any]:
    """Per dtype and device one flat parameter and one flat gradient storage,
    laid out in bucket order (each bucket a contiguous range of it); every
    parameter's .data and .grad become views into them (keeping their
    values), a parameter cut across buckets one view over its buckets'
    ranges. Returns, per bucket, what Bucket is made of."""
    groups: Dict[Tuple[Any, Any], List[int]] = {}
    for bi, pieces in enumerate(plan):
        p = pieces[0][1]
        groups.setdefault((p.dtype, p.device), []).append(bi)
    base = [0] * len(plan)
    flat: Dict[int, int] = {}  # id(parameter) -> its offset in its dtype's storage
    storage: Dict[Tuple[Any, Any], Tuple[torch.Tensor, torch.Tensor]] = {}
    for key, bis in groups.items():
        n = 0
        for bi in bis:
            base[bi] = n
            for name, p, begin, size in plan[bi]:
                if begin == 0:
                    flat[id(p)] = n
                elif flat.get(id(p), -1) + begin != n:  # adapt::plan_buckets puts the pieces end to end
                    raise AssertionError(f"parameter '{name}': piece at {begin} is not after its previous piece")
                n += size
        storage[key] = (torch.empty(n, dtype=key[0], device=key[1]), torch.zeros(n, dtype=key[0], device=key[1]))
    with torch.no_grad():
        for bi, pieces in enumerate(plan):
            for name, p, begin, size in pieces:
                if begin != 0:
                    continue
                fp, fg = storage[(p.dtype, p.device)]
                off = flat[id(p)]
                fp[off:off + p.numel()].copy_(p.reshape(-1))
                p.data = fp[off:off + p.numel()].view_as(p)
                g = fg[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    g.copy_(p.grad)
                p.grad = g
    out = []
    for bi, pieces in enumerate(plan):
        fp, fg = storage[(pieces[0][1].dtype, pieces[0][1].device)]
        out.append((pieces, fp, fg, base[bi], flat))
    return out


def bucket_addresses(addresses: Sequence[str], bucket: int, inproc: bool) -> List[str]:
    """Where bucket ``bucket``'s servers listen, given the job's server
    addresses (bucket 0's): in-process nodes ``<node>/b<bucket>``; UCX
    ``host:port + bucket * num_servers`` (ashl-run reserves a block of
    consecutive ports, ``ASHL_PORTS_PER_SERVER`` per server, so these stay
    disjoint and free; a bucket past the block is refused by name).
    adapt::bucket_addresses computes them, the C++ adapter's code."""
    if bucket > 0 and not inproc:
        reserved = os.environ.get("ASHL_PORTS_PER_SERVER", "")
        if reserved.isdigit() and bucket >= int(reserved):
            raise ValueError(f"bucket {bucket}: ashl-run reserved ASHL_PORTS_PER_SERVER={reserved} ports per server, "
                             f"room for {reserved} buckets; raise ashl-run's --ports-per-server, bucket_cap_mb or partition_mb")
    return _ashl.bucket_addresses(list(addresses), bucket, inproc)


def _bucket_backups(job, bucket: int, inproc: bool) -> List[str]:
    """Bucket ``bucket``'s backup addresses (docs/elastic.md §4.6): the job's
    ``backup_addresses`` placed as ``bucket_addresses`` places the servers'
    (a shard without a backup keeps ""); [] when the job has none."""
    backups = list(job.backup_addresses)
    if not backups:
        return []
    filled = [b or s for b, s in zip(backups, job.server_addresses)]
    return [a if b else "" for a, b in zip(bucket_addresses(filled, bucket, inproc), backups)]


class Bucket:
    """Parameters of one dtype and device flattened into one contiguous
    tensor ``params`` and their gradients into ``grads``: after construction
    every parameter's ``.data`` and ``.grad`` are views into them (a write
    through either is seen through the other). Parameters keep their values.

    ``Bucket(model)`` takes every trainable parameter (tied ones once) and
    needs them all of one dtype and device; DistributedOptimizer makes
    several (``partition``). Raises ValueError naming the parameter and the
    value for a dtype other than float32/float16/bfloat16, a non-contiguous
    tensor, or mixed dtypes or devices.

    ``host_params`` is the float32 CPU buffer the worker pulls into:
    ``params`` itself for a float32 CPU bucket (zero copy), else a staging
    copy (pinned for CUDA); ``send`` the float32 CPU buffer a commit is sent
    from."""

    def __init__(self, model: Any, index: int = 0, _storage: Any = None):
        if _storage is None:
            named = model if isinstance(model, list) and all(isinstance(x, tuple) for x in model) and \
                not isinstance(model, torch.nn.Module) else _named_parameters_unique(model)
            if not named:
                raise ValueError("model.parameters: none requires grad (nothing to train)")
            first: Optional[Tuple[str, torch.Tensor]] = None
            for name, p in named:
                _check(name, p)
                if first is not None and (p.dtype != first[1].dtype or p.device != first[1].device):
                    raise ValueError(f"parameter '{name}': {p.dtype} on {p.device} differs from '{first[0]}''s "
                                     f"{first[1].dtype} on {first[1].device} (one bucket holds one)")
                first = first or (name, p)
            _storage = _alias([[(name, p, 0, p.numel()) for name, p in named]])[0]
        pieces, self._flat_params, self._flat_grads, base, flat = _storage
        self.index = index
        # The parameters overlapping this bucket (a parameter cut across
        # buckets is in each of them), their pieces (begin, size: elements
        # of the flattened parameter), and where each parameter starts
        # relative to params[0] (negative for a later piece's parameter).
        self.names: List[str] = [name for name, _, _, _ in pieces]
        self.tensors: List[torch.Tensor] = [p for _, p, _, _ in pieces]
        self.pieces: List[Tuple[int, int]] = [(begin, size) for _, _, begin, size in pieces]
        self._flat_offsets = [flat[id(p)] for p in self.tensors]
        self.offsets: List[int] = [off - base for off in self._flat_offsets]
        self.dtype = self.tensors[0].dtype
        self.device = self.tensors[0].device
        n = sum(size for _, size in self.pieces)
        self.size = n
        self.params = self._flat_params[base:base + n]
        self.grads = self._flat_grads[base:base + n]
        self.staged = self.dtype != torch.float32 or self.device.type != "cpu"
        pin = self.device.type == "cuda"
        if self.staged:
            self.host_params = torch.empty(n, dtype=torch.float32, pin_memory=pin)
            self.host_params.copy_(self.params)
        else:
            self.host_params = self.params
        self.send = torch.empty(n, dtype=torch.float32, pin_memory=pin)
        # Staging of the gradients for a 16-bit or CUDA bucket.
        self.host_grads = torch.empty(n, dtype=torch.float32, pin_memory=pin) if self.staged else self.grads

    def param_view(self, i: int) -> torch.Tensor:
        """Parameter i's whole view (over every bucket it is cut across)."""
        p, off = self.tensors[i], self._flat_offsets[i]
        return self._flat_params[off:off + p.numel()].view_as(p)

    def grad_view(self, i: int) -> torch.Tensor:
        p, off = self.tensors[i], self._flat_offsets[i]
        return self._flat_grads[off:off + p.numel()].view_as(p)

    def attach(self) -> bool:
        """Makes every .data and .grad a view into the buckets again where the
        caller replaced it (``zero_grad(set_to_none=True)``, ``p.data = ...``),
        copying the replacement's values in first (a .grad of None: zeros).
        True when a .grad was replaced by another tensor."""
        replaced = False
        pb, gb, es = self._flat_params.data_ptr(), self._flat_grads.data_ptr(), self.params.element_size()
        for i, (p, off) in enumerate(zip(self.tensors, self._flat_offsets)):
            if p.data_ptr() != pb + es * off:
                with torch.no_grad():
                    self.param_view(i).copy_(p.data)
                p.data = self.param_view(i)
            g = p.grad
            if g is None or g.data_ptr() != gb + es * off:
                v = self.grad_view(i)
                if g is None:
                    v.zero_()
                else:
                    v.copy_(g)
                    replaced = True
                p.grad = v
        return replaced

    def stage_in(self) -> None:
        """The pulled float32 parameters into a 16-bit or CUDA bucket."""
        if self.staged:
            with torch.no_grad():
                self.params.copy_(self.host_params)

    def stage_params_out(self) -> None:
        if self.staged:
            self.host_params.copy_(self.params)

    def stage_grads_out(self) -> None:
        if self.staged:
            self.host_grads.copy_(self.grads)


class _DeviceUpdate:
    """A bucket's update built on the bucket's device, and encoded there when
    the plan compresses with top-k: for a CUDA bucket only each shard's
    payload crosses to the host, not the whole update. The device
    side of adapt::update_builder (delta: params - w0, w0 the float32 pull;
    gradient: the mean of the cycle's gradients) and of compress/topk.hpp's
    payload (its k rule, layout and header from the native module,
    _ashl.topk_layout; test_topk_layout.py checks the bytes) with
    error feedback (e <- (x + e) - C(x + e), as compress/error_feedback.hpp);
    ps::worker::commit_encoded sends the payloads. Ties in |x| may select
    other indices than the host codec (which takes the lower index); the
    server decodes any valid payload. Other codecs: the update is copied to
    the host and ps::worker encodes it there."""

    def __init__(self, bucket: "Bucket", update: str, error_feedback: bool):
        self.bucket = bucket
        self.delta = update == "delta"
        self.error_feedback = error_feedback
        self.buf = torch.zeros(bucket.size, dtype=torch.float32, device=bucket.device)  # delta: w0; gradient: sum
        self.out = torch.empty(bucket.size, dtype=torch.float32, device=bucket.device)
        self.residual: Optional[torch.Tensor] = None
        self.n = 0
        self._pinned = bucket.device.type == "cuda"
        self._host: List[torch.Tensor] = []

    @property
    def iterations(self) -> int:
        return self.n

    def pulled(self) -> None:
        if self.delta:
            self.buf.copy_(self.bucket.host_params)
        self.n = 0

    def add(self) -> None:
        if not self.delta:
            if self.n == 0:
                self.buf.copy_(self.bucket.grads)
            else:
                self.buf.add_(self.bucket.grads)
        self.n += 1

    def build(self, zero: bool = False) -> None:
        if zero:
            self.out.zero_()
        elif self.delta:
            torch.sub(self.bucket.params.to(torch.float32), self.buf, out=self.out)
        elif self.n <= 1:
            self.out.copy_(self.buf)
        else:
            torch.div(self.buf, float(self.n), out=self.out)

    def dense_into(self, send: torch.Tensor) -> None:
        """A dense commit: the update, paying off what compressed commits dropped."""
        if self.residual is not None:
            self.out.add_(self.residual)
            self.residual.zero_()
        send.copy_(self.out)

    def encode_topk(self, ratio: float, ranges: Sequence[Tuple[int, int]]) -> List[Any]:
        if self.error_feedback:
            if self.residual is None:
                self.residual = torch.zeros_like(self.out)
            acc = self.residual.add_(self.out)  # x + e, kept as the residual
        else:
            acc = self.out
        payloads = []
        for s, (begin, size) in enumerate(ranges):
            a = acc[begin:begin + size]
            # compress::topk's k rule and payload layout, with the header its
            # own writer made (the native module; nothing of it written here).
            k, header, idx_at, val_at, n = _ashl.topk_layout(size, ratio)
            idx = torch.sort(torch.topk(a.abs(), k, sorted=False).indices).values
            vals = a[idx]
            if self.error_feedback:
                a[idx] = 0.0  # (x + e) - C(x + e): what was sent is no longer owed
            if s >= len(self._host) or self._host[s].numel() < n:
                buf = torch.empty(n, dtype=torch.uint8, pin_memory=self._pinned)
                self._host[s:s + 1] = [buf]
            host = self._host[s][:n]
            host[:idx_at].copy_(torch.frombuffer(bytearray(header), dtype=torch.uint8))
            host[idx_at:val_at].copy_(idx.to(torch.int32).view(torch.uint8))  # u32 indices, little-endian
            host[val_at:].copy_(vals.view(torch.uint8))                       # f32 values
            payloads.append(host.numpy())
        return payloads


_METRICS = ("loss", "accuracy", "samples_per_second", "iteration_seconds")


def _ashl_metric_check(name: str) -> None:
    if name not in _METRICS:
        raise ValueError(f"metric = \"{name}\": must be loss, accuracy, samples_per_second or iteration_seconds")


class _Exchange:
    """One bucket's worker, update builder and state in the cycle."""

    def __init__(self, bucket: Bucket, worker: Any, builder: Any):
        self.bucket = bucket
        self.worker = worker
        self.builder = builder
        self.arrived = threading.Event()  # no exchange in flight
        self.arrived.set()
        self.error: Optional[BaseException] = None
        # Metrics and measurements reported while the exchange was in flight
        # (sent when it is complete): callables taking the worker.
        self.pending: List[Any] = []
        self.fills = 0                    # backward passes that completed it in this iteration (outside no_sync)
        self.device: Optional[_DeviceUpdate] = None  # update built and encoded on the bucket's device
        self.encoded: Optional[List[Any]] = None     # the payloads of the commit in flight (device top-k)


def _with_outer(policy: Union[Policy, str, None], local_steps: Optional[int], outer: Dict[str, Any],
                optimizer: Optional[str] = None) -> Optional[Policy]:
    """The policy with ``local_steps`` and the outer_* arguments given (not
    None) added to its parameters: a DiLoCo name reads them all; any other
    policy reads local_steps (local_sgd) and none of outer_* (unless
    ``optimizer == "outer"``: serve() maps them to that optimizer)."""
    given = {k: v for k, v in outer.items() if v is not None}
    if policy is None:
        if given or local_steps is not None:
            name = next(iter(given), "local_steps")
            raise ValueError(f"{name}: set with a policy (policy='diloco', 'async_diloco', 'ashl_diloco', ...)")
        return None
    pol = Policy.of(policy)
    params = dict(pol.params)
    if local_steps is not None:
        if isinstance(local_steps, bool) or not isinstance(local_steps, int) or local_steps < 1:
            raise ValueError(f"local_steps = {local_steps!r}: must be an int >= 1")
        if pol.name not in _LOCAL_STEPS_POLICIES:
            raise ValueError(f"local_steps = {local_steps}: policy {pol.name!r} does not read it "
                             f"(one of {sorted(_LOCAL_STEPS_POLICIES)} does; ashl_diloco plans H_i from h_ahl)")
        params["local_steps"] = local_steps
    if given and pol.name not in DILOCO_POLICIES:
        if optimizer == "outer":
            return Policy(pol.name, **params)
        name = next(iter(given))
        raise ValueError(f"{name} = {given[name]!r}: the outer optimizer runs with a DiLoCo policy "
                         f"({', '.join(sorted(DILOCO_POLICIES))}) or serve(optimizer='outer'); policy is {pol.name!r}")
    if pol.name in DILOCO_POLICIES:
        params.update(given)
    return Policy(pol.name, **params)


def _cycle_count(name: str, doc: str) -> property:
    """One of the bucket cycle's counts as an attribute of the optimizer."""
    return property(lambda self: getattr(self._cycle, name), lambda self, v: setattr(self._cycle, name, int(v)),
                    doc=doc)


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a local torch optimizer so that training runs under ashl's servers.

    ``DistributedOptimizer(optimizer, model, policy=..., compression=...)``
    or ``DistributedOptimizer(model=model, inner=optimizer, ...)``:
    the (inner) optimizer must hold ``model``'s parameters.

    DiLoCo (docs/torch.md, "DiLoCo"): ``DistributedOptimizer(model=model,
    inner=torch.optim.AdamW(model.parameters()), policy="diloco",
    outer_lr=0.7, outer_momentum=0.9, local_steps=500)``: the inner
    optimizer (any; AdamW in the paper) takes local_steps steps, the delta is
    committed, and the servers apply one outer Nesterov step per round on
    the mean delta. "async_diloco" (or "async_local_sgd"): one outer step per
    commit with Delayed Nesterov (outer_delay commits per momentum fold, 0:
    the workers); "ashl_diloco": ASHL's planner sets each worker's local
    steps, data share and compression from a profile. outer_lr,
    outer_momentum, outer_nesterov, outer_weight_decay, outer_delay,
    outer_activation and local_steps go into the policy's parameters (for
    start_servers; without it the servers' own are used, and a local_steps
    the servers do not plan is refused). Each ``step()`` is one
    local iteration; when the plan's iterations (or commit interval) are done
    every bucket commits and pulls the servers' parameters into the model.

    update: "delta" (default; servers with optimizer "model_delta"): the local
    optimizer steps every iteration and the change since the last pull is
    committed (local SGD when the plan says H > 1), in step(). "gradient"
    (servers with optimizer "sgd"): the local optimizer is not stepped; the
    gradient (the mean over the plan's local iterations) is committed, with
    ``overlap`` bucket by bucket while backward runs.

    policy, compression: the job's policy (name or ashl.Policy) and codec name
    ("topk", "qsgd", ..., "none"); the worker checks on joining that its
    servers run them (ValueError otherwise). None: whatever the servers run.

    bucket_cap_mb: bucket size in MiB, "auto" (default: ``bucket_cap_bytes``)
    or 0 / None (one bucket per dtype); partition_mb: a parameter larger
    than this many MiB (default DEFAULT_PARTITION_MB, 4) is cut across
    consecutive buckets, whose pieces are committed and pulled as a pipeline
    (None: not cut; ``bucket_plan``); serve() must be given the same. Every
    bucket runs the first bucket's cycle: its plan (H, commit interval,
    batch, compression ratio, adopted at the cycle start) and its end, also
    for the adaptive policies (docs/torch.md, "Buckets and overlap"). overlap:
    commits in backward (gradient updates) and pulls waited for in forward
    pre-hooks; False: every exchange inside step(), serially.
    commit_in_backward: None (default) is ``overlap and update ==
    "gradient"``: commits in backward from the second step on, when the
    first showed that the loop leaves the gradients as backward made them
    until step() (no accumulation without no_sync(), no clip or unscale_,
    no GradScaler); otherwise every commit goes in step(), which sees the
    final gradients (docs/torch.md, "Training idioms"). False: always in
    step(). GradScaler needs no flag: scaler.step(opt) calls step(), which
    unscales and skips an overflowing step. Under update="gradient" the
    inner optimizer must be torch.optim.SGD (the servers run the
    optimizer; another is refused) and its values must not change.
    check_finite: a step whose gradients hold inf or nan is skipped and not
    committed (default: when a bucket is 16-bit). device_encode: build each
    bucket's update on its device and, when the plan compresses with top-k,
    encode it there (default: for CUDA buckets; True forces it on the CPU). trace: a Chrome trace path
    (default ASHL_TRACE; ashl.trace).

    commit_part_bytes: a bucket's dense commit larger than this goes in
    parts of about that many bytes (0: whole; else >= 4096), each checked by
    the server as it lands, commit_window (1-16) of them in flight
    (docs/ps.md, "Commits in parts"); compressed commits go whole.

    trust_local_lanes: commits to and replies from servers on this host
    (a loopback address) go without their CRC-32C; the servers must be
    started with the same (``serve(trust_local_lanes=True)``), or the first
    exchange fails naming it (docs/ps.md, "Lanes without CRC").

    link: an emulated link in place of ``link_bytes_per_second``'s rate:
    called as ``link("up", bytes)`` before a commit is sent and
    ``link("down", bytes)`` after a pull reply arrived, it holds the thread
    for as long as the bytes take (examples/common/link.py: every method's
    links through one model).

    job: the runtime contract (default: ashl.job()). fabric: an
    ashl.InprocFabric to reach servers in this process (job.server_addresses
    are then node names) instead of UCX.

    start_servers: the torchrun drop-in (docs/torch.md, "From DDP to
    ashl"): every torchrun process is a worker (rank RANK of WORLD_SIZE, as
    DDP's) and RANK 0 also runs the job's servers in threads of its process
    (``serve(background=True)`` with this policy and compression, optimizer
    "model_delta" under update="delta", else "sgd" with the inner SGD's
    values; ``serve_options`` adds serve()'s other arguments). The token is
    ASHL_TOKEN, or one RANK 0 makes and hands to the other ranks of its node
    in a 0600 file (ashl._torchrun). When the process ends (atexit) the
    worker leaves and RANK 0 waits for the servers (until every worker left,
    or none was connected for no_worker_grace), at most
    ``server_wait`` seconds, then stops them.

    loss_fn: a loss module (torch.nn.CrossEntropyLoss() ...) whose last
    output each step() reports as "loss" when the policy reads it (ADSP,
    ASHL); ``step(loss=loss)`` or a closure's loss does the same.
    """

    def __init__(self, optimizer: Optional[torch.optim.Optimizer] = None, model: Any = None,
                 policy: Union[Policy, str, None] = None,
                 compression: Optional[str] = None, *, inner: Optional[torch.optim.Optimizer] = None,
                 local_steps: Optional[int] = None, outer_lr: Optional[float] = None,
                 outer_momentum: Optional[float] = None, outer_nesterov: Optional[bool] = None,
                 outer_weight_decay: Optional[float] = None, outer_delay: Optional[int] = None,
                 outer_activation: Optional[float] = None, update: str = "delta", job: Optional[Job] = None,
                 fabric: Optional[_ashl.InprocFabric] = None, batch_size: int = 32, timeout: float = 30.0,
                 seed: int = 0, error_feedback: bool = True, link_bytes_per_second: float = 0.0,
                 reconnect: float = 0.0, bucket_cap_mb: Union[float, str, None] = "auto",
                 partition_mb: Optional[float] = DEFAULT_PARTITION_MB,
                 overlap: bool = True, commit_in_backward: Optional[bool] = None,
                 check_finite: Optional[bool] = None, trace: Optional[str] = None,
                 incarnation: int = 0, device_encode: Optional[bool] = None,
                 link: Optional[Callable[[str, int], None]] = None, commit_part_bytes: int = 0,
                 commit_window: int = 4, start_servers: bool = False, serve_options: Optional[dict] = None,
                 server_wait: float = 3600.0, loss_fn: Optional[Any] = None, trust_local_lanes: bool = False):
        if optimizer is not None and inner is not None:
            raise ValueError("inner: the inner optimizer is given twice (positional optimizer and inner=); pass one")
        if optimizer is None:
            if inner is None:
                raise ValueError("inner: pass the inner optimizer (inner=torch.optim.AdamW(model.parameters()), ...)")
            optimizer = inner
        if model is None:
            raise ValueError("model: pass the model whose parameters the inner optimizer holds")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer = {type(optimizer).__name__}: must be a torch.optim.Optimizer")
        policy = _with_outer(policy, local_steps, {"outer_lr": outer_lr, "outer_momentum": outer_momentum,
                                                   "outer_nesterov": outer_nesterov,
                                                   "outer_weight_decay": outer_weight_decay,
                                                   "outer_delay": outer_delay, "outer_activation": outer_activation})
        if policy is not None and policy.name in DILOCO_POLICIES and update != "delta":
            raise ValueError(f"update = {update!r}: policy {policy.name!r} commits model deltas (update='delta'), "
                             "its servers' outer optimizer steps on them")
        if update not in ("delta", "gradient"):
            raise ValueError(f"update = {update!r}: must be 'delta' or 'gradient'")
        if batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: must be >= 1")
        if update == "gradient" and type(optimizer) is not torch.optim.SGD:
            name = type(optimizer).__name__
            raise ValueError(f"optimizer = {name}: under update='gradient' the servers run the optimizer "
                             "(serve(optimizer='sgd', lr=..., momentum=..., weight_decay=..., nesterov=...)) and "
                             f"{name} would never step; pass torch.optim.SGD with the servers' values, or "
                             f"update='delta' (servers: optimizer='model_delta') to step {name} on the worker")
        self._inner = optimizer
        # A real torch.optim.Optimizer (step hooks, state_dict hooks, what
        # lr schedulers and GradScaler look for), sharing the inner
        # optimizer's param_groups and state: one set, seen through both.
        self._initializing = True
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)
        self._initializing = False
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        # GradScaler calls step() itself with what it knows (grad_scaler=
        # on torch 1.13, grad_scale and found_inf attributes on torch 2)
        # instead of skipping it: step() unscales and skips, so a scaled
        # gradient is never committed (docs/torch.md, "Training idioms").
        self._step_supports_amp_scaling = True
        self._timeout = float(timeout)
        self._policy = Policy.of(policy) if policy is not None else None
        self._compression = _codec_name(compression)
        self._update = update
        self._buckets = [Bucket(None, i, _storage=st)
                         for i, st in enumerate(_alias(bucket_plan(model, bucket_cap_mb, partition_mb)))]
        in_bucket = {id(p) for b in self._buckets for p in b.tensors}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in in_bucket:
                    raise ValueError(f"optimizer parameter of shape {tuple(p.shape)}: not a parameter of the model")
        self._servers: List[Any] = []
        self._token_file: Optional[str] = None
        self._server_wait = float(server_wait)
        if start_servers:
            if job is not None or fabric is not None:
                raise ValueError("start_servers=True: the job comes from torchrun's variables (RANK, WORLD_SIZE, ...); "
                                 "pass no job and no fabric")
            c = _torchrun.contract()
            job, self._token_file = c.worker, c.token_file
            try:
                for sj in c.servers:  # RANK 0: every server, before its own worker connects
                    self._servers.append(serve(model, sj, policy=policy if policy is not None else "bsp",
                                               compression=compression if compression is not None else "topk",
                                               bucket_cap_mb=bucket_cap_mb, partition_mb=partition_mb, seed=seed,
                                               background=True, **_served_optimizer(optimizer, update),
                                               **dict(serve_options or {})))
            except Exception:
                self._stop_servers(0.0)
                raise
        elif serve_options is not None:
            raise ValueError("serve_options: only with start_servers=True")
        self._job = job if job is not None else _job_from_env()
        if self._job.role != "worker":
            raise ValueError(f"job.role = {self._job.role!r}: a DistributedOptimizer runs on a worker "
                             "(the servers call ashl.torch.serve)")
        self._overlap = bool(overlap)
        self._in_backward = (self._overlap and update == "gradient") if commit_in_backward is None \
            else bool(commit_in_backward and update == "gradient")
        # Commits in backward start at the second iteration, once the first
        # showed that the loop leaves the gradients of backward as they are
        # until step(): one backward per step (no accumulation without
        # no_sync), nothing changed in between (clip_grad_norm_, unscale_),
        # no GradScaler. Any of those turns them off for good (the commit
        # moves to step()); seen after a commit in backward, it is refused.
        self._learned = False
        self._backward_off: Optional[str] = None  # why commits in backward are off
        self._grad_version: Optional[int] = None  # the gradient storages' versions at the last hook
        # Under update="gradient" the servers apply their learning rate:
        # a changed one (an lr scheduler) is refused, not ignored.
        self._group_values = [_sgd_values(g) for g in optimizer.param_groups] if update == "gradient" else None
        self._check_finite = any(b.dtype != torch.float32 for b in self._buckets) if check_finite is None \
            else bool(check_finite)
        self._tracer = Tracer(path_of(trace, "worker", self._job.rank), "worker", self._job.rank)
        self._ex: List[_Exchange] = []
        try:
            for b in self._buckets:
                w = _ashl.Worker(b.host_params.numpy(), bucket_addresses(self._job.server_addresses, b.index,
                                                                         fabric is not None),
                                 rank=self._job.rank, batch=batch_size, timeout=timeout, seed=seed,
                                 error_feedback=error_feedback, link_bytes_per_second=link_bytes_per_second,
                                 reconnect=reconnect, progress_seconds=self._job.progress_seconds if b.index == 0
                                 else 0.0, token=self._job.token, insecure=self._job.insecure,
                                 verbose=self._job.verbose, fabric=fabric, incarnation=incarnation,
                                 job=_job_id(self._job, b.size), follower=b.index > 0, link=link,
                                 commit_part_bytes=commit_part_bytes, commit_window=commit_window,
                                 trust_local_lanes=trust_local_lanes,
                                 backups=_bucket_backups(self._job, b.index, fabric is not None))
                b.stage_in()
                builder = _ashl.UpdateBuilder(update, b.size)
                builder.pulled(b.host_params.numpy())
                ex = _Exchange(b, w, builder)
                if b.device.type == "cuda" if device_encode is None else device_encode:
                    ex.device = _DeviceUpdate(b, update, error_feedback)
                    ex.device.pulled()
                self._ex.append(ex)
        except Exception:
            for e in self._ex:
                with contextlib.suppress(Exception):
                    e.worker.leave()
            self._stop_servers(0.0)
            raise
        try:
            self._check_servers()
        except Exception:
            for e in self._ex:
                with contextlib.suppress(Exception):
                    e.worker.leave()
            self._stop_servers(0.0)
            raise
        self._no_sync = False
        self._plan_check = False
        # The bucket cycle (rules/bucket_cycle.hpp, the rule adapt::torch_worker
        # runs too): which buckets are full, taken and committed, the leader's
        # decision for every bucket, skipped steps, and the counts
        # (iterations, commits, skipped). This class does what it asks.
        self._cycle = _ashl.BucketCycle([len(b.tensors) for b in self._buckets])
        # The leader's plan of this iteration's cycle (bucket 0's worker,
        # taken when the cycle asks it to lead): every follower's plan.
        self._lead_plan: Any = None
        # A DistributedSampler following the data ledger (it registers
        # itself): each iteration's commit carries the samples of the batch
        # it yielded (_trained_samples).
        self._ledger_sampler: Optional["DistributedSampler"] = None
        self._iter_samples: Optional[int] = None
        self._carried = 0
        self.hook_calls: Dict[str, int] = collections.defaultdict(int)
        # Per parameter, its (bucket, slot in the bucket): one for a whole
        # parameter, one per piece for a parameter cut across buckets.
        self._slot_of: Dict[int, List[Tuple[int, int]]] = {}
        for bi, b in enumerate(self._buckets):
            for si, p in enumerate(b.tensors):
                self._slot_of.setdefault(id(p), []).append((bi, si))
        self._grad_storages = list({id(b._flat_grads): b._flat_grads for b in self._buckets}.values())
        self._found_inf: Dict[Any, torch.Tensor] = {}  # per device: the unscale kernel's flag (not read: the scaler's is)
        self._hooks: List[Any] = []
        self._grad_accs: List[Any] = []  # keep the accumulators (and their hooks) alive
        self._install_hooks(model)
        # Two communication threads, one per direction of the link: a full
        # duplex link uploads a bucket while it downloads another.
        self._queue: "queue.Queue" = queue.Queue()  # buckets to commit
        self._cv = threading.Condition()
        self._sent: List[int] = []                  # committed, their pulls not yet waited for
        self._stopping = False
        self._comm = [threading.Thread(target=self._send_loop, name="ashl-send", daemon=True),
                      threading.Thread(target=self._pull_loop, name="ashl-pull", daemon=True)]
        for t in self._comm:
            t.start()
        self._left = False
        self._compute_start = Tracer.now()
        self.wait_seconds = 0.0  # the training thread blocked on pulls (forward pre-hooks, step())
        # The loss the policy reads (ADSP, ASHL): reported by step() from
        # step(loss=...), a closure, or loss_fn's last output.
        stage = self.plan.stage
        self._reports_loss = (self._policy.name in _LOSS_POLICIES) if self._policy is not None \
            else stage in _LOSS_STAGES
        self._last_loss: Optional[torch.Tensor] = None
        if loss_fn is not None:
            if not isinstance(loss_fn, torch.nn.Module):
                raise TypeError(f"loss_fn = {type(loss_fn).__name__}: must be a torch.nn.Module (its forward "
                                "hook sees the loss); for a function pass step(loss=loss)")
            self._hooks.append(loss_fn.register_forward_hook(self._capture_loss))
        # model.state_dict() waits for the pulls in flight: a checkpoint
        # written after step() holds the pulled parameters, never half of them.
        if isinstance(model, torch.nn.Module):
            self._hooks.append(model._register_state_dict_hook(self._state_dict_wait))
        global _current
        _current = weakref.ref(self)
        if start_servers:
            atexit.register(self._at_exit)

    # -- what the servers said ------------------------------------------------

    def _check_servers(self) -> None:
        plan = self.plan
        if self._policy is not None and plan.stage != "none":
            stages = _STAGES.get(self._policy.name)
            if stages is not None and plan.stage not in stages:
                raise ValueError(f"policy = {self._policy.name!r}: the servers run stage {plan.stage!r}")
        if self._policy is not None and self._policy.name in _LOCAL_STEPS_POLICIES and \
                "local_steps" in self._policy.params and plan.stage != "none" and \
                plan.local_iterations != self._policy.params["local_steps"]:
            raise ValueError(f"local_steps = {self._policy.params['local_steps']}: the servers plan "
                             f"{plan.local_iterations} local steps")
        # The servers name their codec only in a plan that compresses (ratio < 1).
        codec = self._ex[0].worker.codec  # canonical, with the plan's options ("block4:64")
        if (self._compression is not None and codec != "identity"
                and codec != _ashl.codec_name(self._compression)):
            raise ValueError(f"compression = {self._compression!r}: the servers' codec is {codec!r}")

    # The counts are the bucket cycle's (load_state_dict sets them).
    iterations = _cycle_count("iterations", "Steps run (not skipped).")
    commits = _cycle_count("commits", "Iterations in which the buckets committed.")
    skipped = _cycle_count("skipped", "Steps skipped as non-finite.")

    @property
    def _lead(self) -> Optional[Tuple[Any, bool]]:
        # This iteration's leader decision: its plan of the cycle and whether
        # its iteration_done() said the cycle is complete; None until a
        # bucket of this iteration asked it (_cycle_done).
        return (self._lead_plan, self._cycle.lead_done) if self._cycle.lead_known else None

    @property
    def plan(self) -> Plan:
        """The plan in force (bucket 0's; every bucket's worker follows it):
        local iterations, commit interval, batch size, data share, ratio, stage."""
        return Plan.from_dict(self._ex[0].worker.plan)

    @property
    def batch_size(self) -> int:
        """The batch the plan says (or the worker's own): size the next batch by it."""
        return self._ex[0].worker.batch

    @property
    def data_share(self) -> float:
        """The fraction of the training data the plan gives this worker (0: unspecified)."""
        return self.plan.data_share

    @property
    def telemetry(self) -> dict:
        """Bucket 0's worker telemetry, with the counters summed over buckets
        (commits and pulls count bucket exchanges), and ``buckets``: each one's;
        read once the exchanges in flight are complete."""
        self._wait_all()
        per = [e.worker.telemetry for e in self._ex]
        t = dict(per[0])
        for k in ("bytes_out", "bytes_in", "wait_seconds", "compress_seconds", "link_seconds", "errors",
                  "copied_replies", "staged_replies", "flipped_replies", "bad_messages", "reply_parts", "commit_parts", "reconnects",
                  "measurement_messages"):
            t[k] = sum(p[k] for p in per)
        t["bucket_commits"] = sum(p["commits"] for p in per)
        t["buckets"] = per
        t["skipped"] = self.skipped
        t["train_wait_seconds"] = self.wait_seconds
        return t

    @property
    def bucket(self) -> Bucket:
        """The first bucket (the whole model when there is one)."""
        return self._buckets[0]

    @property
    def buckets(self) -> List[Bucket]:
        return list(self._buckets)

    @property
    def worker(self) -> _ashl.Worker:
        return self._ex[0].worker

    @property
    def job(self) -> Job:
        return self._job

    def progress_line(self) -> str:
        return self._ex[0].worker.progress_line()

    def _capture_loss(self, _module: Any, _inputs: Any, out: Any) -> None:
        # Only a loss that backward can follow: an evaluation under
        # torch.no_grad() between steps is not the training loss.
        if isinstance(out, torch.Tensor) and out.numel() == 1 and torch.is_grad_enabled():
            self._last_loss = out.detach()

    def _state_dict_wait(self, *_: Any) -> None:
        if not self._left:
            self._wait_all()

    def report_metric(self, name: str, value: float) -> None:
        """A global metric to every bucket's servers: "loss" or "accuracy"
        (ADSP and ASHL read them; each bucket's servers run a copy of the
        policy, fed the same events). While a bucket's exchange is in flight
        its worker belongs to a communication thread, which sends the metric
        when the parameters are back."""
        _ashl_metric_check(name)
        value = float(value)
        for ex in self._ex:
            self._deliver(ex, lambda w: w.report_metric(name, value))

    def _deliver(self, ex: _Exchange, send: Any) -> None:
        """``send(worker)`` now when the bucket's exchange is complete, else
        by the pull thread when it is."""
        with self._cv:
            if ex.arrived.is_set():
                send(ex.worker)
            else:
                ex.pending.append(send)

    # -- hooks ------------------------------------------------------------------

    def _install_hooks(self, model: Any) -> None:
        hooked = set()
        for b in self._buckets:
            for p in b.tensors:
                if id(p) in hooked:  # cut across buckets: one hook marks every piece
                    continue
                hooked.add(id(p))
                # The gradient accumulator's hook (Horovod's way on torch
                # 1.13): it runs once per backward, after the parameter's
                # gradient (summed over its uses when tied) is accumulated.
                acc = p.expand_as(p).grad_fn.next_functions[0][0]
                acc.register_hook(self._make_hook(p))
                self._grad_accs.append(acc)
        if isinstance(model, torch.nn.Module) and self._overlap:
            for mod in model.modules():
                own = [bi for p in mod.parameters(recurse=False) if id(p) in self._slot_of
                       for bi, _ in self._slot_of[id(p)]]  # every bucket of a parameter cut across buckets
                if own:
                    self._hooks.append(mod.register_forward_pre_hook(self._make_pre_hook(sorted(set(own)))))
        self._pre_hooked = isinstance(model, torch.nn.Module) and self._overlap

    def _make_hook(self, p: torch.Tensor):
        slots = self._slot_of[id(p)]
        b0 = self._buckets[slots[0][0]]
        name = b0.names[slots[0][1]]
        view = b0.grad_view(slots[0][1])  # the whole parameter's gradient in the buckets
        ptr = view.data_ptr()

        def hook(*_: Any) -> None:
            self.hook_calls[name] += 1
            g = p.grad
            if g is None or g.data_ptr() != ptr:
                # .grad was None (zero_grad(set_to_none=True), torch 2's
                # default): autograd made a fresh tensor; the bucket is read.
                with torch.no_grad():
                    if g is None:
                        view.zero_()
                    else:
                        view.copy_(g)
                p.grad = view
            # Each bucket the parameter overlaps (its pieces' buckets, in
            # element order): ready when all its parameters are.
            for bi, si in slots:
                if self._cycle.slot_ready(bi, si):
                    if self._no_sync:
                        continue
                    ex = self._ex[bi]
                    ex.fills += 1
                    if ex.fills > 1 and self._cycle.committed(bi):
                        raise RuntimeError(
                            f"bucket {bi}: a second backward before step() (gradient accumulation) after the bucket "
                            "was committed in the first: only the first micro-batch would be trained on. Run the "
                            "micro-batches before the last under `with opt.no_sync():`, or pass "
                            "commit_in_backward=False (commits in step())")
                    if self._in_backward and self._learned and self._backward_off is None:
                        self._bucket_done(bi)
            self._grad_version = self._grads_version()
        return hook

    def _grads_version(self) -> int:
        # In-place changes of a gradient storage (or any view of it) count
        # up its version: the sum says whether anything changed them.
        return sum(t._version for t in self._grad_storages)

    def _make_pre_hook(self, buckets: List[int]):
        def pre_hook(*_: Any) -> None:
            for bi in buckets:
                self._wait_bucket(bi)
        # Run eagerly, never traced into a torch.compile graph: a compiled
        # forward must block here until the pull landed.
        return _eager(pre_hook)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradient accumulation over several backward passes (as DDP's
        no_sync): inside, full buckets are not committed; the backward after
        it (or step()) commits."""
        old, self._no_sync = self._no_sync, True
        try:
            yield
        finally:
            self._no_sync = old

    # -- the communication thread -------------------------------------------

    def _send_loop(self) -> None:
        # Commits in the order their buckets filled (each holds an emulated
        # link's upload, then sends).
        tr = self._tracer
        while True:
            bi = self._queue.get()
            if bi == "stop":
                with self._cv:
                    self._stopping = True
                    self._cv.notify_all()
                return
            ex = self._ex[bi]
            t0 = tr.now()
            try:
                if ex.encoded is not None:
                    ex.worker.commit_encoded(ex.encoded)
                else:
                    ex.worker.commit(ex.bucket.send.numpy())
            except BaseException as e:  # noqa: BLE001 (handed to the training thread)
                ex.error = e
                ex.arrived.set()
                continue
            finally:
                tr.span("commit", "comm", t0, tr.now(), bi)
            with self._cv:
                self._sent.append(bi)
                self._cv.notify_all()

    def _pull_loop(self) -> None:
        # The pulls of committed buckets, the one the next forward needs
        # first (the last bucket: the first layers) first, as BytePS's
        # priority scheduling.
        tr = self._tracer
        while True:
            with self._cv:
                while not self._sent and not self._stopping:
                    self._cv.wait()
                if not self._sent:
                    return
                bi = max(self._sent)
                self._sent.remove(bi)
            ex = self._ex[bi]
            t0 = tr.now()
            try:
                ex.worker.wait()
                ex.bucket.stage_in()
                self._pulled(ex)
                if bi == 0 and len(self._ex) > 1:
                    # The leader's cycle ended: its measurements go to every
                    # bucket's servers (the followers report them as theirs).
                    ms = ex.worker.reported_measurements
                    if len(ms):
                        for f in self._ex[1:]:
                            self._deliver(f, lambda w, ms=ms: w.report_measurements(ms))
            except BaseException as e:  # noqa: BLE001
                ex.error = e
            tr.span("pull", "pull", t0, tr.now(), bi)
            with self._cv:  # _deliver() looks at `arrived` under this lock
                for send in ex.pending:
                    try:
                        send(ex.worker)
                    except BaseException as e:  # noqa: BLE001
                        ex.error = ex.error or e
                ex.pending.clear()
                ex.arrived.set()

    def _wait_bucket(self, bi: int) -> None:
        ex = self._ex[bi]
        if not ex.arrived.is_set():
            t0 = self._tracer.now()
            # The comm threads' commit() and wait() run without the GIL and
            # end within the worker's timeout each; this bound only catches
            # a thread that died.
            if not ex.arrived.wait(3 * self._timeout + 10):
                raise TimeoutError(f"bucket {bi}: its exchange did not end within {3 * self._timeout + 10:.0f} s "
                                   "(the communication threads stopped?)")
            t1 = self._tracer.now()
            self._tracer.span("wait", "train", t0, t1, bi)
            self.wait_seconds += (t1 - t0) * 1e-6
        if ex.error is not None:
            e, ex.error = ex.error, None
            raise e
        if bi == 0 and self._plan_check:
            self._plan_check = False
            self._check_servers()  # a new plan may have come with the parameters

    def _wait_all(self) -> None:
        for bi in range(len(self._ex)):
            self._wait_bucket(bi)

    # -- the training loop ----------------------------------------------------

    def _bucket_done(self, bi: int) -> None:
        """Bucket bi's gradient of this local iteration is complete: the
        bucket cycle takes it (a non-finite one skips the step; a bucket
        committed in this backward before it cannot be taken back, which
        commit_in_backward=False avoids: docs/torch.md) and says what follows."""
        if self._cycle.taken(bi):
            return
        self._wait_bucket(bi)  # its last exchange (a bucket no forward used) is complete
        ex = self._ex[bi]
        b = ex.bucket
        t0 = self._tracer.now()
        if ex.device is not None:
            finite = not self._check_finite or bool(torch.isfinite(b.grads).all())
        else:
            b.stage_grads_out()
            finite = not self._check_finite or _ashl.all_finite(b.host_grads.numpy())
        self._cycle.take(bi, finite)
        self._run_cycle(bi, t0)

    def _run_cycle(self, bi: int, t0: Optional[float]) -> None:
        """What the bucket cycle asks of bucket bi after take(): add its
        gradient (delta: count the iteration), count the iteration
        (_cycle_done), commit (a skipped step's bucket: what its cycle
        holds). The "encode" span runs from t0 (None: from the build)."""
        ex = self._ex[bi]
        cycle = self._cycle
        while True:
            a = cycle.next()
            if a == _ACTION.add:
                if ex.device is not None:
                    ex.device.add()
                else:
                    ex.builder.add(ex.bucket.host_grads.numpy())
            elif a == _ACTION.count:
                self._cycle_done(bi)
            elif a == _ACTION.none:
                if t0 is not None:
                    self._tracer.span("encode", "train", t0, self._tracer.now(), bi)
                return
            else:
                t0 = self._tracer.now() if t0 is None else t0
                held = a == _ACTION.commit_held
                self._build(bi, zero=held and (ex.device or ex.builder).iterations == 0)
                self._tracer.span("encode", "train", t0, self._tracer.now(), bi)
                self._commit(bi)
                return

    def _pulled(self, ex: _Exchange) -> None:
        if ex.device is not None:
            ex.device.pulled()
        else:
            ex.builder.pulled(ex.bucket.host_params.numpy())

    def _build(self, bi: int, zero: bool = False) -> None:
        """Bucket bi's update of the cycle into its send buffer, or, built on
        the device under a top-k plan, into payloads (ex.encoded)."""
        ex = self._ex[bi]
        b = ex.bucket
        ex.encoded = None
        if ex.device is None:
            if zero:
                b.send.zero_()
            else:
                if self._update == "delta":
                    b.stage_params_out()
                ex.builder.build(b.host_params.numpy(), b.send.numpy())
            return
        ex.device.build(zero)
        w = ex.worker
        if w.compresses and w.codec == "topk":
            ex.encoded = ex.device.encode_topk(w.current_plan.plan["compression_ratio"], w.shard_ranges)
        else:
            ex.device.dense_into(b.send)

    def _cycle_done(self, bi: int) -> bool:
        """Bucket bi's worker counts this iteration, as the bucket cycle asks;
        true when its cycle is complete. Bucket 0's worker leads: its
        iteration_done() decides, once per iteration, for every bucket, and
        its plan of the cycle (adopted at the cycle's start, taken before it
        commits) is every follower's plan (ps::worker_params::follower). So
        all buckets run one cycle: the same H, commit interval, batch and
        compression ratio, ADSP's and ASHL's per-worker plans included."""
        cycle = self._cycle
        while True:
            a = cycle.count_next()
            if a == _COUNT.lead:
                if bi != 0:
                    self._wait_bucket(0)  # its last exchange is complete: its plan is this cycle's
                lw = self._ex[0].worker
                self._lead_plan = lw.current_plan
                self._iter_samples = self._trained_samples()
                cycle.led(lw.iteration_done(self._iter_samples))
            elif a == _COUNT.follow:
                cycle.followed(self._ex[bi].worker.follow(self._lead_plan, cycle.lead_done, self._iter_samples))
            else:
                return cycle.decision

    def _trained_samples(self) -> Optional[int]:
        """The samples this iteration trained, for its commit (docs/elastic.md
        §3.6): the next batch size a DistributedSampler following the data
        ledger yielded (a lease's last batch may be short), with the batches
        of steps skipped whole before it (their positions are passed over,
        not trained again); None without one: the plan's batch."""
        s = self._ledger_sampler
        if s is None:
            return None
        n = s._take_batch()
        if n is None:
            return None
        n, self._carried = n + self._carried, 0
        return n

    def _commit(self, bi: int) -> None:
        ex = self._ex[bi]
        if bi == 0:
            self._plan_check = True
        ex.arrived.clear()
        self._queue.put(bi)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the gradient buckets; gradients stay views into them
        (set_to_none is accepted and ignored: a .grad set to None elsewhere,
        model.zero_grad() on torch 2, is taken back into the bucket by the
        gradient hook, so either way trains alike)."""
        for b in self._buckets:
            b.attach()
            b.grads.zero_()

    @torch.no_grad()
    def step(self, closure=None, **kwargs: Any):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._left:
            raise RuntimeError("step() after leave()")
        scaler = kwargs.pop("grad_scaler", None)  # GradScaler on torch 1.13
        given = kwargs.pop("loss", None)
        if given is not None:
            loss = given if closure is None else loss
        reported = given if given is not None else loss if loss is not None else self._last_loss
        self._last_loss = None
        if kwargs:
            raise TypeError(f"step() got unexpected keyword arguments {sorted(kwargs)}")
        t_step = self._tracer.now()
        self._tracer.span("compute", "train", self._compute_start, t_step)
        changed = self._grad_version is not None and self._grads_version() != self._grad_version
        for b in self._buckets:
            changed = b.attach() or changed
        self._learn(changed, scaler)
        if self._reports_loss and reported is not None:
            value = float(reported.detach()) if isinstance(reported, torch.Tensor) else float(reported)
            if math.isfinite(value):  # an overflowing (skipped) step's loss is no measurement
                self.report_metric("loss", value)
        if self._group_values is not None:
            for i, g in enumerate(self.param_groups):
                if _sgd_values(g) != self._group_values[i]:
                    k = next(k for k, a, b in zip(_SGD_KEYS, _sgd_values(g), self._group_values[i]) if a != b)
                    raise ValueError(f"param_groups[{i}]['{k}'] = {g.get(k)!r}, was {dict(zip(_SGD_KEYS, self._group_values[i]))[k]!r}: "
                                     "under update='gradient' the servers apply their own (serve(lr=..., momentum=...)); "
                                     "an lr scheduler or a changed value needs update='delta'")
        cycle = self._cycle
        if self._check_finite and not cycle.skipping:
            for b in self._buckets:
                if not bool(torch.isfinite(b.grads).all()):
                    cycle.skip()
                    break
        if not cycle.begin_step():
            # The step is skipped: no local step, no commit, no iteration.
            if self._ledger_sampler is not None:  # its batch's positions go with the next commit
                self._carried += self._ledger_sampler._take_batch() or 0
            self._end_iteration()
            return loss
        if self._update == "delta":
            self._wait_all()
            if not cycle.skipping:
                self._inner.step()
            for bi in range(len(self._ex)):
                cycle.take(bi, True)
                self._run_cycle(bi, None)  # add: counts the iteration
        else:
            for bi in range(len(self._ex)):
                self._bucket_done(bi)  # the buckets not committed in backward: some parameter had no gradient, or no overlap
        cycle.end_step()
        if not self._pre_hooked:
            self._wait_all()
        self._end_iteration()
        return loss

    def _learn(self, changed: bool, scaler: Any) -> None:
        """What this iteration's loop did between backward and step():
        commits in backward stay on only when it did nothing (see
        _backward_off); a GradScaler's scaled gradients are unscaled here
        and an overflowing step skipped, as GradScaler.step() does."""
        found_inf = getattr(self, "found_inf", None)  # set by torch 2's GradScaler.step() around this call
        scaled = scaler is not None or found_inf is not None
        fills = max(ex.fills for ex in self._ex)
        why = ("a GradScaler (its gradients in backward are scaled)" if scaled else
               "gradient accumulation without no_sync()" if fills > 1 else
               "gradients changed between backward and step() (clip_grad_norm_, unscale_ ...)" if changed else None)
        if why is not None:
            if self._cycle.any_committed:
                raise RuntimeError(f"{why} after buckets were committed in backward with the gradients as backward "
                                   "left them: pass commit_in_backward=False (commits in step()), or do the same "
                                   "from the first step on (the first step shows it, and commits then move to step())")
            self._backward_off = self._backward_off or why
        self._learned = True
        if scaled:
            if scaler is not None:
                try:
                    scaler.unscale_(self)
                except RuntimeError as e:
                    if "already been called" not in str(e):
                        raise
                inf = sum(float(v.item()) for v in scaler._per_optimizer_states[id(self)]["found_inf_per_device"].values())
            else:
                scale = getattr(self, "grad_scale", None)  # None: the caller already called unscale_
                if scale is not None:  # GradScaler.unscale_'s reciprocal and kernel: the same bits
                    inv = scale.double().reciprocal().float()
                    for t in self._grad_storages:
                        found = self._found_inf.get(t.device)
                        if found is None:
                            found = self._found_inf[t.device] = torch.zeros(1, dtype=torch.float32, device=t.device)
                        torch._amp_foreach_non_finite_check_and_unscale_([t], found, inv.to(t.device))
                inf = float(found_inf.item())
            if inf:
                self._cycle.skip()

    def _end_iteration(self) -> None:
        self._grad_version = None
        for ex in self._ex:
            ex.fills = 0
        self._cycle.end_iteration()
        self._compute_start = self._tracer.now()

    def wait(self) -> None:
        """Waits for every bucket's exchange in flight: the model then holds
        the servers' parameters. (Training loops need not call it: a forward
        pre-hook waits for each bucket before its first layer runs.)"""
        self._wait_all()

    def synchronize(self) -> None:
        """Waits for the exchanges in flight and pulls the servers' parameters
        into the model now (outside a cycle's iterations)."""
        self._wait_all()
        for ex in self._ex:
            ex.worker.pull()
            ex.worker.wait()
            ex.bucket.stage_in()
            self._pulled(ex)

    def leave(self) -> None:
        """Leaves the servers (a worker that is done; they stop when every
        worker left); writes the trace."""
        if self._left:
            return
        self._left = True
        global _current
        if _current is not None and _current() is self:
            _current = None  # a DistributedSampler no longer follows this one
        try:
            self._wait_all()
        finally:
            self._queue.put("stop")
            for t in self._comm:
                t.join()
            for h in self._hooks:
                h.remove()
            self._tracer.close()
            for ex in self._ex:
                ex.worker.leave()

    def add_param_group(self, param_group: dict) -> None:
        if getattr(self, "_initializing", False):  # Optimizer.__init__ adds the inner optimizer's groups
            torch.optim.Optimizer.add_param_group(self, param_group)
            return
        raise ValueError("add_param_group: the buckets are fixed when the DistributedOptimizer is made")

    def state_dict(self) -> Dict[str, Any]:
        """The inner optimizer's state and param_groups (torch's format,
        with this optimizer's state_dict hooks), and under "ashl" this
        worker's: the update kind, bucket sizes (checked on load),
        iterations, commits, skipped steps, and whether commits in backward
        were turned off (and why). The parameters themselves are the
        servers' (their checkpoints; docs/checkpoints.md)."""
        sd = torch.optim.Optimizer.state_dict(self)
        sd["ashl"] = {"update": self._update, "buckets": [b.size for b in self._buckets],
                      "iterations": self.iterations, "commits": self.commits, "skipped": self.skipped,
                      "learned": self._learned, "backward_off": self._backward_off}
        return sd

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Loads what state_dict() returned into the inner optimizer (and
        this one: they share one state); a state_dict of another update kind
        or other buckets is refused by name. One without "ashl" (the inner
        optimizer's own) loads the inner state only."""
        sd = dict(state_dict)
        mine = sd.pop("ashl", None)
        if mine is not None:
            if mine.get("update") != self._update:
                raise ValueError(f"state_dict['ashl']['update'] = {mine.get('update')!r}: this optimizer's is "
                                 f"{self._update!r}")
            sizes = [b.size for b in self._buckets]
            if list(mine.get("buckets", [])) != sizes:
                raise ValueError(f"state_dict['ashl']['buckets'] = {mine.get('buckets')}: this optimizer's buckets "
                                 f"hold {sizes} elements (another model, bucket_cap_mb or partition_mb)")
        torch.optim.Optimizer.load_state_dict(self, sd)  # new state and groups (this optimizer's hooks run)
        self._inner.__setstate__({"state": self.state, "param_groups": self.param_groups})
        self.state = self._inner.state
        self.param_groups = self._inner.param_groups
        if self._group_values is not None:
            self._group_values = [_sgd_values(g) for g in self.param_groups]
        if mine is not None:
            self.iterations = int(mine.get("iterations", self.iterations))
            self.commits = int(mine.get("commits", self.commits))
            self.skipped = int(mine.get("skipped", self.skipped))
            self._learned = bool(mine.get("learned", self._learned))
            self._backward_off = mine.get("backward_off", self._backward_off)

    def _stop_servers(self, wait: float) -> None:
        """RANK 0 of start_servers: waits up to ``wait`` seconds for the
        servers to end (every worker left, or none connected for
        no_worker_grace), then stops them; removes the token file."""
        deadline = time_monotonic() + wait
        for s in self._servers:
            subs = s.servers if isinstance(s, Servers) else [s]
            while time_monotonic() < deadline and any(x.ended == "running" for x in subs):
                time_sleep(0.05)
            with contextlib.suppress(Exception):
                s.stop()
            with contextlib.suppress(Exception):
                s.join()
        self._servers = []
        if self._token_file:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._token_file)
            self._token_file = None

    def _at_exit(self) -> None:
        try:
            self.leave()
        except Exception as e:  # the process is ending: say why, and still end the servers
            print(f"ashl: leave() at exit: {e}", file=sys.stderr)
        self._stop_servers(self._server_wait)

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    def __repr__(self) -> str:
        return (f"DistributedOptimizer({self._inner!r}, update={self._update!r}, buckets={len(self._buckets)}, "
                f"plan={self.plan})")


# The SGD values the servers apply under update="gradient" (the worker's
# copies must not change while it trains).
_SGD_KEYS = ("lr", "momentum", "weight_decay", "nesterov", "dampening")


def layer_fragment_sizes(model: Any, fragments: int) -> List[int]:
    """Elements of each of StreamingDiLoCo's ``fragments`` fragments of
    ``model`` (runs of consecutive parameter tensors, tied ones once, of about
    equal size; ``_ashl.layer_fragments``): what fragment p's servers hold,
    known before any worker exists (a launcher sizes its servers with it).
    ValueError, by name, for fragments 0 or more than the parameter tensors."""
    sizes = [p.numel() for _, p in _named_parameters_unique(model)]
    bounds = list(_ashl.layer_fragments(sizes, fragments)) + [len(sizes)]
    return [sum(sizes[bounds[f]:bounds[f + 1]]) for f in range(fragments)]


class StreamingDiLoCo:
    """Streaming DiLoCo's worker (rules/streaming.hpp; docs/torch.md,
    "Streaming fragments"): the model's parameters cut into ``fragments``
    runs of consecutive parameter tensors (layers) of about equal size, each
    synchronised with its own servers every ``local_steps`` inner steps at
    its own offset, its exchange overlapped with the next ``delay`` inner
    steps and then merged: local = alpha*local + (1-alpha)*servers'.

    ``inner`` is the local optimizer (stepped by ``step()``); ``servers[p]``
    lists fragment p's server addresses (ordinary ashl servers over that
    fragment's elements, ``fragment_sizes()`` or ``layer_fragment_sizes``;
    Local SGD with model deltas for plain averaging, ``diloco`` for the
    outer optimizer; their ``compression``/``compression_ratio``, e.g.
    "block4" at 0.125, make the fragment commits 4-bit). The schedule, the
    merge and the split are the C++ rule's (``_ashl.StreamingSchedule``,
    ``streaming_merge``, ``layer_fragments``), as ps::streaming_worker and
    the simulator run them.
    CPU float32 parameters. Bad values are refused by name (ValueError):
    fragments 0 or more than the model's parameter tensors or than
    local_steps, delay >= local_steps, alpha outside [0, 1].

    ``link``: an emulated link, as DistributedOptimizer's: called as
    ``link("up", bytes)`` before a fragment's commit is sent and
    ``link("down", bytes)`` after its reply arrived, it holds the calling
    thread while the bytes cross (examples/common/link.py). A hold blocks,
    so with a link each fragment's exchange (commit, the server's round,
    reply) runs on a thread of its own, started at the sync and joined at
    the merge: it overlaps the next ``delay`` inner steps as a real
    transfer would, instead of stalling them. ``telemetry``: the fragments'
    workers' counters summed, and ``wait_seconds``, the time ``step()``
    waited at merges for an exchange still under way.
    """

    def __init__(self, inner: torch.optim.Optimizer, model: Any, servers: Sequence[Sequence[str]], fragments: int,
                 local_steps: int, delay: int = 0, alpha: float = 0.5, rank: int = 0, timeout: float = 30.0,
                 token: str = "", insecure: bool = False, fabric: Any = None, job: int = 0,
                 link: Optional[Callable[[str, int], None]] = None):
        import numpy as np
        self._np = np
        self.inner = inner
        self._params = [p for _, p in _named_parameters_unique(model)]
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(f"parameter {i}: dtype {p.dtype} on {p.device}: StreamingDiLoCo takes CPU float32")
        self._schedule = _ashl.StreamingSchedule(fragments, local_steps, delay, alpha, len(self._params), "layers")
        self.alpha = float(alpha)
        if len(servers) != fragments:
            raise ValueError(f"servers: {len(servers)} address lists: must be one per fragment ({fragments})")
        if link is not None and not callable(link):
            raise ValueError(f"link: {type(link).__name__}: must be callable as link(direction, bytes) or None")
        self._threaded = link is not None
        sizes = [p.numel() for p in self._params]
        bounds = list(_ashl.layer_fragments(sizes, fragments)) + [len(self._params)]
        self._frags: List[Dict[str, Any]] = []
        for f in range(fragments):
            ps_ = self._params[bounds[f]:bounds[f + 1]]
            n = sum(p.numel() for p in ps_)
            served = np.zeros(n, dtype=np.float32)
            w = _ashl.Worker(served, list(servers[f]), rank=rank, timeout=timeout, token=token, insecure=insecure,
                             fabric=fabric, follower=True, job=job, link=link)
            fr = {"params": ps_, "served": served, "ref": served.copy(), "delta": np.zeros(n, dtype=np.float32),
                  "local": np.zeros(n, dtype=np.float32), "worker": w, "flying": False, "thread": None,
                  "error": None}
            self._scatter(fr, served)  # the join's pull: the servers' values are the model
            self._frags.append(fr)
        self.steps = 0
        self.syncs = 0
        self.wait_seconds = 0.0

    def fragment_sizes(self) -> List[int]:
        """Elements of each fragment (what its servers hold)."""
        return [int(f["served"].size) for f in self._frags]

    @property
    def workers(self) -> List[Any]:
        """Each fragment's ashl Worker (its ``codec``, ``plan``, ``telemetry``)."""
        return [f["worker"] for f in self._frags]

    @property
    def telemetry(self) -> dict:
        """The fragments' workers' numeric counters summed (bytes_out,
        bytes_in, link_seconds, ...), with ``wait_seconds`` the merges' waits."""
        out: Dict[str, Any] = {}
        for fr in self._frags:
            for k, v in fr["worker"].telemetry.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + v
        out["wait_seconds"] = self.wait_seconds
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)

    @torch.no_grad()
    def _gather(self, fr: Dict[str, Any]) -> None:
        o = 0
        for p in fr["params"]:
            k = p.numel()
            torch.from_numpy(fr["local"][o:o + k]).copy_(p.detach().reshape(-1))
            o += k

    @torch.no_grad()
    def _scatter(self, fr: Dict[str, Any], values: Any) -> None:
        o = 0
        for p in fr["params"]:
            k = p.numel()
            p.copy_(torch.from_numpy(values[o:o + k]).view_as(p))
            o += k

    def step(self, closure: Any = None) -> Any:
        """One inner step, then the schedule's sync (the fragment's delta
        leaves at once) and merge (waits for that fragment's answer)."""
        loss = self.inner.step(closure) if closure is not None else self.inner.step()
        self.steps += 1
        p = self._schedule.sync_after(self.steps)
        q = self._schedule.merge_after(self.steps)
        for i, fr in enumerate(self._frags):
            if not fr["flying"]:
                fr["worker"].follow(fr["worker"].current_plan, p == i)
        if p is not None:
            fr = self._frags[p]
            self._gather(fr)
            self._np.subtract(fr["local"], fr["ref"], out=fr["delta"])
            if self._threaded:
                fr["error"] = None
                fr["thread"] = threading.Thread(target=self._exchange, args=(fr,), name=f"fragment{p}",
                                                daemon=True)
                fr["thread"].start()
            else:
                fr["worker"].commit(fr["delta"])
            fr["flying"] = True
            self.syncs += 1
        if q is not None:
            self._merge(q)
        return loss

    @staticmethod
    def _exchange(fr: Dict[str, Any]) -> None:
        # A communication thread's whole exchange (the link's holds inside
        # commit() and wait()); an error is raised by the merge that joins it.
        try:
            fr["worker"].commit(fr["delta"])
            fr["worker"].wait()
        except BaseException as e:  # noqa: BLE001 (raised again on the training thread)
            fr["error"] = e

    def _merge(self, f: int) -> None:
        fr = self._frags[f]
        t0 = time_monotonic()
        if fr["thread"] is not None:
            fr["thread"].join()
            fr["thread"] = None
            if fr["error"] is not None:
                fr["flying"] = False
                raise fr["error"]
        else:
            fr["worker"].wait()
        self.wait_seconds += time_monotonic() - t0
        self._gather(fr)
        _ashl.streaming_merge(fr["local"], fr["served"], fr["ref"], self.alpha)
        self._scatter(fr, fr["local"])
        fr["flying"] = False

    def finish(self) -> None:
        """Merges every fragment still on the wire."""
        for f, fr in enumerate(self._frags):
            if fr["flying"]:
                self._merge(f)

    def leave(self) -> None:
        self.finish()
        for fr in self._frags:
            fr["worker"].leave()


def _sgd_values(group: dict) -> Tuple[Any, ...]:
    return tuple(group.get(k) for k in _SGD_KEYS)


def _eager(fn: Callable) -> Callable:
    """fn, never traced by torch.compile (dynamo graph-breaks around it and
    runs it as Python): torch.compiler.disable on torch >= 2.1,
    torch._dynamo.disable on 2.0; fn itself on torch 1.x."""
    disable = getattr(getattr(torch, "compiler", None), "disable", None)
    if disable is None:
        try:
            import torch._dynamo as dynamo  # noqa: F401 (torch 2.0)
            disable = dynamo.disable
        except ImportError:
            return fn
    return disable(fn)


class Servers:
    """A server process's servers, one per bucket (ashl.Server each):
    start/stop/join them together. ``telemetry`` is bucket 0's with
    ``buckets`` (each one's)."""

    def __init__(self, servers: List[_ashl.Server]):
        self.servers = servers
        self._threads: List[threading.Thread] = []

    @property
    def address(self) -> str:
        return self.servers[0].address

    def start(self) -> None:
        for s in self.servers:
            s.start()

    def run(self) -> None:
        self.start()
        self.join()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def join(self) -> None:
        """Waits for every bucket's server; then raises the first failure
        (a final checkpoint that could not be written, naming its file)."""
        failed = None
        for s in self.servers:
            try:
                s.join()
            except RuntimeError as e:
                failed = failed or e
        if failed is not None:
            raise failed

    def parameters(self) -> list:
        """Each bucket's server's parameters (numpy, bucket order), each one
        version (ashl.Server.parameters())."""
        return [s.parameters() for s in self.servers]

    @property
    def all_left(self) -> bool:
        return all(s.all_left for s in self.servers)

    @property
    def telemetry(self) -> dict:
        t = dict(self.servers[0].telemetry)
        t["buckets"] = [s.telemetry for s in self.servers]
        return t

    def progress_line(self) -> str:
        return self.servers[0].progress_line()

    @property
    def ended(self) -> str:
        """Why the servers' run() returned (bucket 0's: they end alike)."""
        return self.servers[0].ended


def serve(model: Any, job: Optional[Job] = None, policy: Union[Policy, str, None] = "bsp",
          compression: Optional[str] = "topk", *, compression_ratio: float = 1.0,
          optimizer: Optional[str] = None, lr: float = 0.1,
          momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
          local_steps: Optional[int] = None, outer_lr: Optional[float] = None,
          outer_momentum: Optional[float] = None, outer_nesterov: Optional[bool] = None,
          outer_weight_decay: Optional[float] = None, outer_delay: Optional[int] = None,
          outer_activation: Optional[float] = None,
          fabric: Optional[_ashl.InprocFabric] = None, listen: Optional[str] = None,
          worker_timeout: float = 20.0, progress_seconds: Optional[float] = None, checkpoint_dir: str = "",
          checkpoint_every: float = 0.0, restore: bool = False, seed: int = 0,
          background: bool = False, bucket_cap_mb: Union[float, str, None] = "auto",
          partition_mb: Optional[float] = DEFAULT_PARTITION_MB,
          store_bytes: int = 0, allow_non_finite: bool = False, max_commit_samples: int = 1 << 30,
          no_worker_grace: Optional[float] = None, apply_threads: int = 1, reply_part_bytes: int = 0,
          apply_batch: int = 1, apply_parts_as_they_land: bool = False,
          reply_compression: Optional[str] = None, reply_ratio: float = 1.0,
          trust_local_lanes: bool = False, dataset_size: Optional[int] = None, shuffle_seed: int = 0,
          ledger: Optional[Dict[str, Any]] = None) -> Any:
    """Runs this process's servers of the job (job.role == "server"), one per
    bucket (``bucket_plan(model, bucket_cap_mb, partition_mb)``, as the workers make
    them), starting from ``model``'s parameters (its shard of each bucket).
    Blocks until every worker left and returns the server (an ashl.Server
    for a one-bucket model, else ``Servers``); ``background=True`` starts
    them in threads and returns at once (stop() and join() end them). The
    servers end when every worker left, or when none was connected for
    ``no_worker_grace`` seconds (by default the job's, ASHL_NO_WORKER_GRACE or
    60); each server's ``ended`` says why.

    ``store_bytes`` bounds the commits each server buffers for a round (0:
    automatic, workers x the largest commit of its shard of the bucket); a
    NaN or infinite update is refused unless ``allow_non_finite``; a commit
    saying it covers more than ``max_commit_samples`` samples is refused
    (docs/ps.md, "Values from workers"). ``apply_threads`` threads apply
    each commit, each on its own part of the shard (1..64; the same bits for
    any count; docs/ps.md, "Apply threads"). A dense pull reply above
    ``reply_part_bytes`` goes in parts of about that many bytes, each
    checksummed on its own (0: one message, else >= 4096; docs/ps.md,
    "Messages"). Up to ``apply_batch`` dense commits that arrive together
    are added in one pass over the parameters (1: each as it arrives, else
    2..64; the same bits; docs/ps.md, "Batched applies"). With
    ``apply_parts_as_they_land``, a commit a worker sends in parts
    (``commit_part_bytes``) is added beside the parameters as its parts
    land and takes their place once its last part passed (one more
    shard-sized buffer; the same bits; docs/ps.md, "Commits in parts");
    by default it is applied whole at its last part.

    compression, compression_ratio: the codec a compressing plan commits
    with ("topk", "block4:128", ...; docs/codecs.md) and the ratio the servers
    give the plans their policy leaves dense (1, default: those commit
    dense; e.g. "block4" with 0.125: DiLoCo's 4-bit pseudo-gradients).

    reply_compression, reply_ratio: the codec of the pull replies (None,
    default: dense). With e.g. "block4" each worker's first reply is dense
    and every later one carries what its copy of the parameters lacks, 4
    bits a value; what a reply drops the next one sends (error feedback).
    The servers keep one copy of their shard per worker for it
    (docs/ps.md, "Compressed replies"). reply_ratio is the kept share of
    the ratio codecs ("topk", ...).

    trust_local_lanes: commits from and replies to workers on this host (a
    loopback address) go without their CRC-32C; the workers must say the
    same (``DistributedOptimizer(trust_local_lanes=True)``; docs/ps.md,
    "Lanes without CRC").

    dataset_size, shuffle_seed: a data ledger of that many samples on the
    first bucket's server 0 (docs/elastic.md §3; docs/torch.md, "The data
    ledger"): it hands each worker leases of positions of every epoch's
    permutation (seeded shuffle_seed + epoch), so every sample is trained
    once per epoch however workers join, leave or die;
    ``DistributedSampler`` follows them. ``ledger``: its other parameters
    (lease_samples, ahead, give_back_after, epochs; ps::ledger_params),
    ahead 2 unless given. None (default): no ledger.

    optimizer: None (default) is the policy's: "model_delta", or for a
    DiLoCo name ("diloco", "async_diloco", "async_local_sgd",
    "ashl_diloco") its outer optimizer, set by outer_lr (0.7),
    outer_momentum (0.9), outer_nesterov (True), outer_weight_decay (0),
    outer_delay (asynchronous forms: Delayed Nesterov's N, 0: the workers)
    and outer_activation (its c); local_steps is the inner steps per round
    (docs/torch.md, "DiLoCo"). "sgd" (gradient updates) takes lr,
    momentum, weight_decay, nesterov; "outer" runs the outer optimizer with
    any other delta policy (ADSP, ASHL, ...) from the outer_* arguments."""
    job = job if job is not None else _job_from_env()
    outer = {"outer_lr": outer_lr, "outer_momentum": outer_momentum, "outer_nesterov": outer_nesterov,
             "outer_weight_decay": outer_weight_decay, "outer_delay": outer_delay,
             "outer_activation": outer_activation}
    policy = _with_outer(policy if policy is not None else "bsp", local_steps, outer, optimizer)
    if optimizer == "outer" and policy.name not in DILOCO_POLICIES:
        # The outer optimizer beside another delta policy: its values from outer_*.
        lr = 0.7 if outer_lr is None else outer_lr
        momentum = 0.9 if outer_momentum is None else outer_momentum
        nesterov = (True if outer_nesterov is None else bool(outer_nesterov)) and momentum > 0
        weight_decay = 0.0 if outer_weight_decay is None else outer_weight_decay
        delay = 1 if outer_delay is None else outer_delay
        activation = 0.0 if outer_activation is None else outer_activation
    else:
        delay, activation = 1, 0.0
    if job.role != "server":
        raise ValueError(f"job.role = {job.role!r}: serve() runs on a server (the workers make a DistributedOptimizer)")
    pol = Policy.of(policy)
    if dataset_size is None and ledger:
        raise ValueError("serve(ledger=...): needs dataset_size (the data ledger's samples)")
    ledger_params = {} if dataset_size is None else \
        {"ahead": 2, **(ledger or {}), "samples": int(dataset_size), "shuffle_seed": int(shuffle_seed)}
    address = listen if listen is not None else job.server_addresses[job.rank]
    servers = []
    for bi, pieces in enumerate(bucket_plan(model, bucket_cap_mb, partition_mb)):
        with torch.no_grad():
            initial = torch.cat([p.detach().reshape(-1)[begin:begin + size].to(torch.float32).cpu()
                                 for _, p, begin, size in pieces]).contiguous()
        ckpt = f"{checkpoint_dir}/bucket{bi}" if checkpoint_dir and bi else checkpoint_dir
        if ckpt:
            os.makedirs(ckpt, exist_ok=True)
        srv = _restoring(bi, bucket_cap_mb, partition_mb, _ashl.Server,
                         initial=initial.numpy(), policy=pol.name, policy_params=dict(pol.params),
                         workers=job.num_workers, max_workers=_max_workers(job),
                         listen=bucket_addresses([address], bi, fabric is not None)[0]
                         if job.num_servers == 1 or bi == 0 else
                         bucket_addresses(list(job.server_addresses), bi, fabric is not None)[job.rank],
                         shard=job.rank, servers=job.num_servers, optimizer=optimizer or "", lr=lr,
                         momentum=momentum, weight_decay=weight_decay, nesterov=nesterov, nesterov_delay=delay,
                         nesterov_activation=activation,
                         compression=_codec_name(compression) or "topk", compression_ratio=compression_ratio,
                         token=job.token, insecure=job.insecure,
                         verbose=job.verbose, worker_timeout=worker_timeout,
                         progress_seconds=(job.progress_seconds if progress_seconds is None else progress_seconds)
                         if bi == 0 else 0.0,
                         checkpoint_dir=ckpt,
                         checkpoint_every=checkpoint_every, restore=restore, seed=seed, fabric=fabric,
                         store_bytes=store_bytes, allow_non_finite=allow_non_finite,
                         max_commit_samples=max_commit_samples,
                         no_worker_grace=job.no_worker_grace if no_worker_grace is None else no_worker_grace,
                         job=_job_id(job, initial.numel()), apply_threads=apply_threads,
                         reply_part_bytes=reply_part_bytes, apply_batch=apply_batch,
                         apply_parts_as_they_land=apply_parts_as_they_land,
                         reply_compression=_codec_name(reply_compression) or "identity", reply_ratio=reply_ratio,
                         trust_local_lanes=trust_local_lanes,
                         ledger=ledger_params if bi == 0 else {})  # server 0 of bucket 0 (the plan authority)
        servers.append(srv)
    out = servers[0] if len(servers) == 1 else Servers(servers)
    if background:
        out.start()
    else:
        out.run()
    return out


def _restoring(bucket: int, bucket_cap_mb: Any, partition_mb: Any, make: Any, **kw: Any) -> Any:
    """make(**kw); a checkpoint refused for its elements (checkpoint.elements)
    also names the bucket plan: one written with another partition_mb or
    bucket_cap_mb has other buckets (docs/torch.md, "Checkpoints")."""
    try:
        return make(**kw)
    except ValueError as e:
        if not kw.get("restore") or "checkpoint.elements" not in str(e):
            raise
        raise ValueError(f"{e}; bucket {bucket} of bucket_plan(model, bucket_cap_mb={bucket_cap_mb!r}, "
                         f"partition_mb={partition_mb!r}): a checkpoint written with another partition_mb or "
                         f"bucket_cap_mb is restored with those (partition_mb=None: written before partitioning)"
                         ) from e


def _max_workers(job: Job) -> int:
    """The most workers the job may have (ps::max_workers_of): max_workers,
    or num_workers where it is 0 (not said)."""
    return max(int(job.max_workers), int(job.num_workers))


def _job_id(job: Job, elements: int) -> int:
    """The job id every process of the job computes alike (ps::job_id_of): per
    bucket, from the bucket's elements, with the job's maximum of workers
    (docs/elastic.md §2.2: not said, it is num_workers and the id is the one
    the job had before there was a maximum)."""
    return _ashl.make_job_id(job.name, int(elements), _max_workers(job), job.num_servers)


def _served_optimizer(optimizer: torch.optim.Optimizer, update: str) -> Dict[str, Any]:
    """serve()'s optimizer arguments for start_servers: the policy's under
    update="delta" (model_delta, or a DiLoCo name's outer optimizer); under "gradient" "sgd" with the inner SGD's values (one
    set: the servers apply one lr to every parameter)."""
    if update == "delta":
        return {}  # the policy's: model_delta, or a DiLoCo name's outer optimizer
    values = {_sgd_values(g) for g in optimizer.param_groups}
    if len(values) != 1:
        raise ValueError(f"optimizer.param_groups: {len(values)} different (lr, momentum, weight_decay, nesterov, "
                         "dampening) sets; under update='gradient' the servers apply one, use update='delta'")
    g = optimizer.param_groups[0]
    if g.get("dampening", 0) not in (0, 0.0):
        raise ValueError(f"param_groups[0]['dampening'] = {g['dampening']!r}: the servers' sgd has none; use 0 "
                         "or update='delta'")
    return {"optimizer": "sgd", "lr": float(g["lr"]), "momentum": float(g.get("momentum", 0.0)),
            "weight_decay": float(g.get("weight_decay", 0.0)), "nesterov": bool(g.get("nesterov", False))}


class DistributedSampler(torch.utils.data.Sampler):
    """torch's DistributedSampler, following the plan (docs/torch.md, "From DDP to ashl").

    ``DistributedSampler(dataset, num_replicas=None, rank=None, shuffle=True,
    seed=0, drop_last=False, batch_size=None, optimizer=None)``: each epoch
    (``set_epoch``) the dataset's indices are shuffled with ``seed + epoch``
    as torch's DistributedSampler does, and this worker takes its share:

    - every share equal (the plan's ``data_share`` is 0, unspecified, or
      1/num_replicas: BSP, ASP, Local SGD, ...): torch's split exactly
      (padded to a multiple of num_replicas, ``indices[rank::num_replicas]``),
      so it gives the same batches as torch's sampler;
    - otherwise (ASHL, DLB) a contiguous slice of the shuffled indices of
      ``data_share`` of the dataset. Its place comes from every worker's
      share, gathered with torch.distributed once per epoch when a process
      group is initialized (the workers meet there once an epoch); without
      one the slice starts at the worker's equal-share place and may overlap
      another's.

    The shares are read when an epoch's iteration starts. With
    ``batch_size`` it is a batch sampler (``DataLoader(dataset,
    batch_sampler=sampler)``): each batch is the plan's batch size when the
    batch is drawn (its ``batch_size``; ``batch_size`` while the plan names
    none), so a plan that changes it mid-epoch reaches the next batch the
    loader draws (a DataLoader with worker processes draws
    ``num_workers * prefetch_factor`` batches ahead, so that many later);
    ``len()`` counts batches of the size in force when it is called.
    ``optimizer``: the DistributedOptimizer whose plan it follows (default:
    the one made last in this process, looked up at each epoch); num_replicas
    and rank default to its job's workers and rank, else WORLD_SIZE and RANK.

    With a data ledger (``serve(..., dataset_size=N, shuffle_seed=s)``; docs/
    elastic.md §3.6) it follows the ledger instead, automatically once
    server 0 sent the optimizer's worker a lease (``ledger=False`` keeps the
    split above): it yields ``π_e[p]`` (``randperm(N)`` seeded ``s + e``,
    the identity without ``shuffle``) for the positions p of its leases in
    order, in batches of the plan's size (a batch may span two leases; it is
    short only at the epoch's end, or dropped with ``drop_last``: passed
    over, counted with the batch before it); the epoch
    is the ledger's (an iteration ends with its last lease of epoch e once
    its next lease is of a later epoch; ``set_epoch`` is accepted, another
    epoch than the ledger's warns once); it waits for the next lease at most
    the worker's ``timeout`` (then TimeoutError naming worker.timeout_ms).
    Every batch size it yields goes into a queue that each iteration of the
    optimizer takes the next of, so a commit says the samples it trained,
    even with a DataLoader drawing batches ahead; a loader must not draw
    more batches ahead than the worker's leases hold (the ledger's ``ahead``
    x its lease size: serve() grants 2 leases ahead, 8 cycles' batches);
    when the next lease has not come while yielded batches wait to be
    trained, the iteration ends early (the next one goes on in the same
    epoch) rather than hold back the commits that bring the lease. A
    sampler that joins mid-epoch, or leaves, changes nothing of the others':
    every sample is trained once per epoch by whoever holds its position.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False, batch_size: Optional[int] = None,
                 optimizer: Optional["DistributedOptimizer"] = None, ledger: bool = True):
        if batch_size is not None and batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: must be >= 1 (or None: an index sampler)")
        if num_replicas is not None and num_replicas < 1:
            raise ValueError(f"num_replicas = {num_replicas}: must be >= 1")
        if rank is not None and num_replicas is not None and not 0 <= rank < num_replicas:
            raise ValueError(f"rank = {rank}: must be in [0, {num_replicas})")
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.batch_size = batch_size
        self.optimizer = optimizer
        self.epoch = 0
        self.ledger = ledger
        # Following the data ledger: the lease being yielded ([number,
        # epoch, next position, end]), the next one held back (of a later
        # epoch: the next iteration's), the highest lease number taken, the
        # ledger's epoch, permutations by epoch, the batches yielded and not
        # yet trained ((samples, epoch), oldest first) and the last one an
        # optimizer step took (last_step).
        self._lease: Optional[List[int]] = None
        self._taken = 0
        self._ledger_epoch: Optional[int] = None
        self._perms: Dict[int, List[int]] = {}
        self._batches: "collections.deque" = collections.deque()
        self.last_step: Optional[Tuple[int, int]] = None
        self._warned_epoch = False

    def set_epoch(self, epoch: int) -> None:
        if self._ledger_epoch is not None and epoch != self._ledger_epoch and not self._warned_epoch:
            self._warned_epoch = True
            warnings.warn(f"DistributedSampler.set_epoch({epoch}): the data ledger's epoch is {self._ledger_epoch} "
                          "(the sampler follows the ledger's; docs/elastic.md §3.6)", stacklevel=2)
        self.epoch = epoch

    # -- the data ledger (docs/elastic.md §3.6) ------------------------------

    def _ledger_worker(self, opt: Optional["DistributedOptimizer"]) -> Any:
        """The optimizer's leading worker when server 0 runs a data ledger
        (it sent a lease), else None."""
        if not self.ledger or opt is None:
            return None
        ex = getattr(opt, "_ex", None)
        if not ex:
            return None
        w = ex[0].worker
        return w if w.ledger[0] > 0 else None

    def _take_batch(self) -> Optional[int]:
        """The optimizer's iteration takes the oldest batch yielded (None: none waits)."""
        if not self._batches:
            return None
        self.last_step = self._batches.popleft()
        return self.last_step[0]

    def _perm(self, epoch: int, n: int, seed: int) -> List[int]:
        p = self._perms.get(epoch)
        if p is None:
            if self.shuffle:
                g = torch.Generator()
                g.manual_seed(seed + epoch)
                p = torch.randperm(n, generator=g).tolist()
            else:
                p = list(range(n))
            self._perms = {e: q for e, q in self._perms.items() if e >= epoch - 1}
            self._perms[epoch] = p
        return p

    def _poll_lease(self, w: Any) -> Optional[List[int]]:
        """The lowest-numbered lease the worker holds that this sampler has
        not taken (taking it), or None."""
        fresh = [x for x in w.leases if x["number"] > self._taken]
        if not fresh:
            w.progress()
            fresh = [x for x in w.leases if x["number"] > self._taken]
        if not fresh:
            return None
        x = min(fresh, key=lambda x: x["number"])
        self._taken = x["number"]
        return [x["number"], x["epoch"], x["begin"], x["end"]]

    def _next_lease(self, w: Any, timeout: float) -> List[int]:
        """_poll_lease, waiting for one (driving the worker's transport) at
        most ``timeout`` seconds."""
        deadline = time_monotonic() + timeout
        while True:
            lease = self._poll_lease(w)
            if lease is not None:
                return lease
            if time_monotonic() >= deadline:
                raise TimeoutError(
                    f"worker.timeout_ms = {int(timeout * 1000)}: passed while the DistributedSampler waited for a "
                    f"lease of the data ledger from server 0 (lease {self._taken + 1}); a worker gets one as its "
                    "commits use the positions it holds, or when another worker's go back or an epoch completes")
            time_sleep(0.001)

    def _iter_ledger(self, opt: "DistributedOptimizer", w: Any):
        n, seed = w.ledger
        if len(self.dataset) != n:
            raise ValueError(f"len(dataset) = {len(self.dataset)}: the servers' data ledger has {n} samples "
                             "(serve(dataset_size=...))")
        opt._ledger_sampler = self
        timeout = float(getattr(opt, "_timeout", 30.0))
        if self._lease is None:
            self._lease = self._next_lease(w, timeout)
        epoch = self._lease[1] if self._ledger_epoch is None else self._ledger_epoch
        self._ledger_epoch = epoch
        self.epoch = epoch
        batch: List[int] = []
        batch_epoch = epoch
        while True:
            lease = self._lease
            if lease[1] > epoch:  # this iteration's epoch is over; the lease starts the next
                break
            perm = self._perm(lease[1], n, seed)
            while lease[2] < lease[3]:
                if batch and lease[1] != batch_epoch:  # a batch holds one epoch's positions
                    yield from self._emit(batch, batch_epoch)
                    batch = []
                batch_epoch = lease[1]
                b = self._batch() if self.batch_size is not None else 1
                k = min(b - len(batch), lease[3] - lease[2])
                batch.extend(perm[lease[2]:lease[2] + k])
                lease[2] += k
                if len(batch) == b:
                    yield from self._emit(batch, batch_epoch)
                    batch = []
            nxt = self._poll_lease(w)
            if nxt is None and self._batches:
                # No lease yet, and batches it yielded wait to be trained (a
                # DataLoader drew them ahead): waiting here would hold them
                # back, and with them the commits that bring the next lease.
                # The iteration ends early; the next one goes on in this epoch.
                self._lease = None
                if batch:
                    yield from self._emit(batch, batch_epoch)
                return
            self._lease = nxt if nxt is not None else self._next_lease(w, timeout)
        if batch and not (self.drop_last and self.batch_size is not None):
            yield from self._emit(batch, batch_epoch)
        elif batch:  # dropped (drop_last): passed over, counted with the batch before it
            if self._batches:
                k, e = self._batches[-1]
                self._batches[-1] = (k + len(batch), e)
            else:
                opt._carried += len(batch)
        self._ledger_epoch = self._lease[1]

    def _emit(self, batch: List[int], epoch: int):
        if self.batch_size is None:
            yield from batch
            return
        self._batches.append((len(batch), epoch))
        yield list(batch)

    def _opt(self) -> Optional["DistributedOptimizer"]:
        if self.optimizer is not None:
            return self.optimizer
        return _current() if _current is not None else None

    def _where(self, opt: Optional["DistributedOptimizer"]) -> Tuple[int, int]:
        if opt is not None:
            w, r = opt.job.num_workers, opt.job.rank
        else:
            w, r = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
        w = self.num_replicas if self.num_replicas is not None else w
        r = self.rank if self.rank is not None else r
        if not 0 <= r < w:
            raise ValueError(f"rank = {r}: must be in [0, {w}) (num_replicas)")
        return w, r

    def _shares(self, opt: Optional["DistributedOptimizer"], w: int, r: int,
                gather: bool) -> Tuple[Optional[List[float]], bool]:
        """Every worker's share (None when all are equal), and whether the
        others' are known (gathered) rather than assumed."""
        if opt is None:
            return None, True
        mine = float(opt.data_share)
        policy = opt._policy.name if opt._policy is not None else None
        adaptive = policy in ADAPTIVE_POLICIES if policy is not None else \
            opt.plan.stage in ("profile", "ahl", "shl", "dlb")
        dist = torch.distributed
        known = False
        if gather and adaptive and w > 1 and dist.is_available() and dist.is_initialized() \
                and dist.get_world_size() == w:
            got: List[Any] = [None] * w
            dist.all_gather_object(got, mine)
            shares = [float(x) for x in got]
            known = True
        else:
            if mine == 0.0 or abs(mine - 1.0 / w) < 1e-6:
                return None, True
            shares = [1.0 / w] * w
            shares[r] = mine
        if all(s == 0.0 for s in shares) or all(abs(s - 1.0 / w) < 1e-6 for s in shares):
            return None, True
        return [s if s > 0.0 else 1.0 / w for s in shares], known  # unspecified: an equal share

    def _indices(self, gather: bool = True) -> List[int]:
        n = len(self.dataset)
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            indices = torch.randperm(n, generator=g).tolist()
        else:
            indices = list(range(n))
        opt = self._opt()
        w, r = self._where(opt)
        shares, known = self._shares(opt, w, r, gather)
        if shares is None:  # torch.utils.data.DistributedSampler's split, step for step
            if self.drop_last and n % w != 0:
                per = math.ceil((n - w) / w)
            else:
                per = math.ceil(n / w)
            total = per * w
            if not self.drop_last:
                pad = total - len(indices)
                if pad <= len(indices):
                    indices += indices[:pad]
                else:
                    indices += (indices * math.ceil(pad / len(indices)))[:pad]
            else:
                indices = indices[:total]
            return indices[r:total:w]
        if known:  # consecutive slices, by every worker's share
            whole = sum(shares)
            begin, end = round(n * sum(shares[:r]) / whole), round(n * sum(shares[:r + 1]) / whole)
        else:  # the others' shares unknown: from its equal-share place, its own length
            begin = (r * n) // w
            end = begin + round(n * shares[r])
        return [indices[i % n] for i in range(begin, max(end, begin + 1))]

    def _batch(self) -> int:
        opt = self._opt()
        planned = int(opt.plan.batch_size) if opt is not None else 0
        return planned if planned > 0 else int(self.batch_size)

    def __iter__(self):
        w = self._ledger_worker(self._opt())
        if w is not None:
            yield from self._iter_ledger(self._opt(), w)
            return
        indices = self._indices()
        self._count = len(indices)
        if self.batch_size is None:
            yield from indices
            return
        i = 0
        while i < len(indices):
            b = self._batch()
            batch = indices[i:i + b]
            if len(batch) < b and self.drop_last:
                return
            yield batch
            i += b

    def __len__(self) -> int:
        w = self._ledger_worker(self._opt())
        if w is not None:  # the current epoch's positions held and not yielded, in batches (an estimate)
            e = self._ledger_epoch
            left = self._lease[3] - self._lease[2] if self._lease is not None and self._lease[1] == e else 0
            left += sum(x["end"] - x["begin"] for x in w.leases
                        if x["number"] > self._taken and (e is None or x["epoch"] == e))
            if self.batch_size is None:
                return left
            b = self._batch()
            return left // b if self.drop_last else math.ceil(left / b)
        # No collective here (len() may be called on one rank alone): the
        # count of the last epoch's iteration, else without gathered shares.
        n = getattr(self, "_count", None)
        if n is None:
            n = len(self._indices(gather=False))
        if self.batch_size is None:
            return n
        b = self._batch()
        return n // b if self.drop_last else math.ceil(n / b)
