"""ashl.torch: PyTorch training under ashl's parameter servers, one changed line.

    import torch, ashl
    model = Net()
    job = ashl.job()                                    # the runtime contract ashl-run set
    if job.role == "server":
        ashl.torch.serve(model, job, policy="ashl", compression="topk")   # until every worker left
    else:
        opt = ashl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model,
                                              policy="ashl", compression="topk")
        for x, y in loader:                             # opt.batch_size: the plan's batch
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()                                  # local step; commit + pull when the plan says
        opt.leave()

and ``ashl.run([sys.executable, "train.py"], servers=1, workers=4)`` starts the job.

The model's parameters and gradients are flattened once into one float32
bucket each (like DDP's gradient_as_bucket_view): every parameter's .data and
.grad are views into them, so the worker commits straight from the gradient
bucket and the servers' parameters land straight in the parameter bucket.
docs/torch.md has the details; include/ashl/adapt/torch.hpp is the same for C++.
"""
from __future__ import annotations

from typing import Any, Iterable, List, Optional, Sequence, Tuple, Union

import torch

from . import Job, Plan, Policy, _ashl
from . import job as _job_from_env

__all__ = ["Bucket", "DistributedOptimizer", "serve"]

# The plan stages each policy's servers send (core/plan.hpp, stage_id): a
# worker whose servers run another policy than it was told fails at once.
_STAGES = {
    "bsp": {"bsp"}, "asp": {"asp"}, "ssp": {"ssp"}, "local_sgd": {"local_sgd"}, "dssp": {"dssp"},
    "semi_async": {"semi_async"}, "adsp": {"adsp"}, "ashl": {"profile", "ahl", "shl"}, "dlb": {"dlb"},
}


def _codec_name(compression: Optional[str]) -> Optional[str]:
    if compression is None:
        return None
    if not isinstance(compression, str):
        raise TypeError(f"compression = {compression!r}: must be a codec name (str) or None")
    return "identity" if compression == "none" else compression


def _named_parameters(model: Any) -> List[Tuple[str, torch.Tensor]]:
    if isinstance(model, torch.nn.Module):
        named = list(model.named_parameters())
    else:
        named = [item if isinstance(item, tuple) else (str(i), item) for i, item in enumerate(model)]
    return [(n, p) for n, p in named if p.requires_grad]


class Bucket:
    """A model's trainable parameters flattened into one contiguous float32
    tensor ``params``, and their gradients into ``grads``: after construction
    every parameter's ``.data`` and ``.grad`` are views into them (a write
    through either is seen through the other). Parameters keep their values.

    Raises ValueError naming the parameter and the value for a dtype other
    than float32, a device other than the CPU, or a non-contiguous tensor."""

    def __init__(self, model: Any):
        named = _named_parameters(model)
        if not named:
            raise ValueError("model.parameters: none requires grad (nothing to train)")
        seen = set()
        self.names: List[str] = []
        self.tensors: List[torch.Tensor] = []
        for name, p in named:
            if id(p) in seen:  # shared (tied) parameters: one slot
                continue
            seen.add(id(p))
            if p.dtype != torch.float32:
                raise ValueError(f"parameter '{name}'.dtype = {p.dtype}: must be torch.float32")
            if p.device.type != "cpu":
                raise ValueError(f"parameter '{name}'.device = {p.device}: the Python adapter takes CPU tensors "
                                 "(CUDA tensors: include/ashl/adapt/torch.hpp, docs/torch.md)")
            if not p.is_contiguous():
                raise ValueError(f"parameter '{name}'.stride = {tuple(p.stride())}: must be contiguous "
                                 f"(shape {tuple(p.shape)}); call .contiguous() when building the model")
            self.names.append(name)
            self.tensors.append(p)
        self.offsets: List[int] = []
        n = 0
        for p in self.tensors:
            self.offsets.append(n)
            n += p.numel()
        self.size = n
        self.params = torch.empty(n, dtype=torch.float32)
        self.grads = torch.zeros(n, dtype=torch.float32)
        with torch.no_grad():
            for p, off in zip(self.tensors, self.offsets):
                self.params[off:off + p.numel()].copy_(p.reshape(-1))
                p.data = self.params[off:off + p.numel()].view_as(p)
                g = self.grads[off:off + p.numel()].view_as(p)
                if p.grad is not None:
                    g.copy_(p.grad)
                p.grad = g

    def param_view(self, i: int) -> torch.Tensor:
        p, off = self.tensors[i], self.offsets[i]
        return self.params[off:off + p.numel()].view_as(p)

    def grad_view(self, i: int) -> torch.Tensor:
        p, off = self.tensors[i], self.offsets[i]
        return self.grads[off:off + p.numel()].view_as(p)

    def attach(self) -> None:
        """Makes every .data and .grad a view into the buckets again where the
        caller replaced it (``zero_grad(set_to_none=True)``, ``p.data = ...``),
        copying the replacement's values in first."""
        pb, gb = self.params.data_ptr(), self.grads.data_ptr()
        for i, (p, off) in enumerate(zip(self.tensors, self.offsets)):
            if p.data_ptr() != pb + 4 * off:
                with torch.no_grad():
                    self.param_view(i).copy_(p.data)
                p.data = self.param_view(i)
            g = p.grad
            if g is None or g.data_ptr() != gb + 4 * off:
                v = self.grad_view(i)
                if g is None:
                    v.zero_()
                else:
                    v.copy_(g)
                p.grad = v


class DistributedOptimizer(torch.optim.Optimizer):
    """Wraps a local torch optimizer so that training runs under ashl's servers.

    ``DistributedOptimizer(optimizer, model, policy=..., compression=...)``:
    ``optimizer`` must hold ``model``'s parameters. Each ``step()`` is one
    local iteration; when the plan's iterations (or commit interval) are done
    it commits and pulls the servers' parameters into the model.

    update: "delta" (default; servers with optimizer "model_delta"): the local
    optimizer steps every iteration and the change since the last pull is
    committed (local SGD when the plan says H > 1). "gradient" (servers with
    optimizer "sgd"): the local optimizer is not stepped; the gradient (the
    mean over the plan's local iterations) is committed and the servers step.

    policy, compression: the job's policy (name or ashl.Policy) and codec name
    ("topk", "qsgd", ..., "none"); the worker checks on joining that its
    servers run them (ValueError otherwise). None: whatever the servers run.

    job: the runtime contract (default: ashl.job(), from the ASHL_* variables
    ashl-run sets). fabric: an ashl.InprocFabric to reach servers in this
    process (job.server_addresses are then node names) instead of UCX.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, model: Any, policy: Union[Policy, str, None] = None,
                 compression: Optional[str] = None, *, update: str = "delta", job: Optional[Job] = None,
                 fabric: Optional[_ashl.InprocFabric] = None, batch_size: int = 32, timeout: float = 30.0,
                 seed: int = 0, error_feedback: bool = True, link_bytes_per_second: float = 0.0,
                 reconnect: float = 0.0):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer = {type(optimizer).__name__}: must be a torch.optim.Optimizer")
        if update not in ("delta", "gradient"):
            raise ValueError(f"update = {update!r}: must be 'delta' or 'gradient'")
        if batch_size < 1:
            raise ValueError(f"batch_size = {batch_size}: must be >= 1")
        self._inner = optimizer
        self._policy = Policy.of(policy) if policy is not None else None
        self._compression = _codec_name(compression)
        self._update = update
        self._bucket = Bucket(model)
        in_bucket = {id(p) for p in self._bucket.tensors}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in in_bucket:
                    raise ValueError(f"optimizer parameter of shape {tuple(p.shape)}: not a parameter of the model")
        # Shared with the local optimizer: LR schedulers and state_dict see one set.
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self.defaults = optimizer.defaults
        self._job = job if job is not None else _job_from_env()
        if self._job.role != "worker":
            raise ValueError(f"job.role = {self._job.role!r}: a DistributedOptimizer runs on a worker "
                             "(the servers call ashl.torch.serve)")
        self._worker = _ashl.Worker(self._bucket.params.numpy(), list(self._job.server_addresses),
                                    rank=self._job.rank, batch=batch_size, timeout=timeout, seed=seed,
                                    error_feedback=error_feedback, link_bytes_per_second=link_bytes_per_second,
                                    reconnect=reconnect, progress_seconds=self._job.progress_seconds,
                                    token=self._job.token, insecure=self._job.insecure, verbose=self._job.verbose,
                                    fabric=fabric)
        self._check_servers()
        self._w0 = self._bucket.params.clone() if update == "delta" else None
        self._delta = torch.empty_like(self._bucket.params) if update == "delta" else None
        self._acc = torch.zeros_like(self._bucket.params) if update == "gradient" else None
        self._accumulated = 0
        self._left = False
        self.iterations = 0
        self.commits = 0

    # -- what the servers said ------------------------------------------------

    def _check_servers(self) -> None:
        plan = self.plan
        if self._policy is not None and plan.stage != "none":
            stages = _STAGES.get(self._policy.name)
            if stages is not None and plan.stage not in stages:
                raise ValueError(f"policy = {self._policy.name!r}: the servers run stage {plan.stage!r}")
        # The servers name their codec only in a plan that compresses (ratio < 1).
        codec = self._worker.codec
        if self._compression is not None and codec != "identity" and codec != self._compression:
            raise ValueError(f"compression = {self._compression!r}: the servers' codec is {codec!r}")

    @property
    def plan(self) -> Plan:
        """The plan in force: local iterations, commit interval, batch size, data share, ratio, stage."""
        return Plan.from_dict(self._worker.plan)

    @property
    def batch_size(self) -> int:
        """The batch the plan says (or the worker's own): size the next batch by it."""
        return self._worker.batch

    @property
    def data_share(self) -> float:
        """The fraction of the training data the plan gives this worker (0: unspecified)."""
        return self.plan.data_share

    @property
    def telemetry(self) -> dict:
        return self._worker.telemetry

    @property
    def bucket(self) -> Bucket:
        return self._bucket

    @property
    def worker(self) -> _ashl.Worker:
        return self._worker

    @property
    def job(self) -> Job:
        return self._job

    def progress_line(self) -> str:
        return self._worker.progress_line()

    def report_metric(self, name: str, value: float) -> None:
        """A global metric to the servers: "loss" or "accuracy" (ADSP and ASHL read them)."""
        self._worker.report_metric(name, float(value))

    # -- the training loop ----------------------------------------------------

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zeroes the gradient bucket; gradients stay views into it (set_to_none is ignored)."""
        self._bucket.attach()
        self._bucket.grads.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._left:
            raise RuntimeError("step() after leave()")
        self._bucket.attach()
        self.iterations += 1
        if self._update == "delta":
            self._inner.step()
            if self._worker.iteration_done():
                torch.sub(self._bucket.params, self._w0, out=self._delta)
                self._exchange(self._delta)
                self._w0.copy_(self._bucket.params)
        else:
            done = self._worker.iteration_done()
            if done and self._accumulated == 0:
                self._exchange(self._bucket.grads)  # straight from the gradient bucket
            else:
                self._acc.add_(self._bucket.grads)
                self._accumulated += 1
                if done:
                    self._acc.div_(self._accumulated)
                    self._exchange(self._acc)
                    self._acc.zero_()
                    self._accumulated = 0
        return loss

    def _exchange(self, update: torch.Tensor) -> None:
        self._worker.commit(update.numpy())
        self._worker.wait()  # the servers' parameters are in the bucket now
        self.commits += 1
        self._check_servers()  # a new plan may have come with them

    def synchronize(self) -> None:
        """Pulls the servers' parameters into the model now (outside a cycle's iterations)."""
        self._worker.pull()
        self._worker.wait()
        if self._w0 is not None:
            self._w0.copy_(self._bucket.params)

    def leave(self) -> None:
        """Leaves the servers (a worker that is done; they stop when every worker left)."""
        if not self._left:
            self._left = True
            self._worker.leave()

    def add_param_group(self, param_group: dict) -> None:
        raise ValueError("add_param_group: the bucket is fixed when the DistributedOptimizer is made")

    def __enter__(self) -> "DistributedOptimizer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self._inner!r}, update={self._update!r}, plan={self.plan})"


def serve(model: Any, job: Optional[Job] = None, policy: Union[Policy, str, None] = "bsp",
          compression: Optional[str] = "topk", *, optimizer: str = "model_delta", lr: float = 0.1,
          momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
          fabric: Optional[_ashl.InprocFabric] = None, listen: Optional[str] = None,
          worker_timeout: float = 20.0, progress_seconds: Optional[float] = None, checkpoint_dir: str = "",
          checkpoint_every: float = 0.0, restore: bool = False, seed: int = 0,
          store_bytes: int = 0, allow_non_finite: bool = False, max_commit_samples: int = 1 << 30,
          background: bool = False) -> _ashl.Server:
    """Runs this process's server of the job (job.role == "server"), starting
    from ``model``'s parameters (its shard of them). Blocks until every worker
    left and returns the server (its telemetry); ``background=True`` starts it
    in a thread and returns at once (stop() and join() end it).

    ``store_bytes`` bounds the commits a server buffers for a round (0:
    automatic, workers x the largest commit of its shard); a NaN or infinite
    update is refused unless ``allow_non_finite``; a commit saying it covers
    more than ``max_commit_samples`` samples is refused (docs/ps.md)."""
    job = job if job is not None else _job_from_env()
    if job.role != "server":
        raise ValueError(f"job.role = {job.role!r}: serve() runs on a server (the workers make a DistributedOptimizer)")
    pol = Policy.of(policy)
    with torch.no_grad():
        initial = torch.cat([p.detach().reshape(-1).to(torch.float32).cpu()
                             for _, p in _named_parameters_unique(model)]).contiguous()
    address = listen if listen is not None else job.server_addresses[job.rank]
    srv = _ashl.Server(initial=initial.numpy(), policy=pol.name, policy_params=dict(pol.params),
                       workers=job.num_workers, listen=address, shard=job.rank, servers=job.num_servers,
                       optimizer=optimizer, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov,
                       compression=_codec_name(compression) or "topk", token=job.token, insecure=job.insecure,
                       verbose=job.verbose, worker_timeout=worker_timeout,
                       progress_seconds=job.progress_seconds if progress_seconds is None else progress_seconds,
                       checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every, restore=restore, seed=seed,
                       store_bytes=store_bytes, allow_non_finite=allow_non_finite,
                       max_commit_samples=max_commit_samples, fabric=fabric)
    if background:
        srv.start()
    else:
        srv.run()
    return srv


def _named_parameters_unique(model: Any) -> List[Tuple[str, torch.Tensor]]:
    seen, out = set(), []
    for n, p in _named_parameters(model):
        if id(p) not in seen:
            seen.add(id(p))
            out.append((n, p))
    return out
