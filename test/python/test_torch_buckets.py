"""ashl.torch's buckets and overlap (docs/torch.md "Buckets and overlap (Python)"): buckets alias parameters and
gradients; overlapped and serial exchanges give bit-identical parameters
under BSP; the gradient hooks fire once per parameter per backward with
gradient accumulation and tied parameters; a bf16 loop, with a non-finite
step skipped and not committed; torchrun's and SLURM's variables; a trace
that parses; a parameter larger than partition_mb cut across buckets that
alias it, bit-identical BSP with it, a forward waiting for every piece."""
import json
import os
import sys
import threading

import pytest
import torch

import ashl
import ashl.torch as at
from torch_testing import KIB, flat, in_threads, jobs, mlp

HERE = os.path.dirname(os.path.abspath(__file__))


def test_buckets_follow_reverse_registration_order_and_alias_parameters_and_gradients():
    model = mlp()
    before = flat(model)
    groups = at.partition(model, bucket_cap_mb=2 * KIB)  # 2 KiB: Linear(32, 32)'s weight (4 KiB) alone
    names = [[n for n, _ in g] for g in groups]
    assert names[0] == ["4.weight", "4.bias"] or names[0][0] == "4.bias"  # the last layer first
    assert [n for g in names for n in g] == [n for n, _ in reversed(list(model.named_parameters()))]
    assert len(groups) >= 3
    # Policies that plan from measurements are bucketed alike (their buckets follow bucket 0's cycle).
    assert [len(at.partition(model, 2 * KIB, p)) for p in ("ashl", "adsp", "dlb", "bsp")] == [len(groups)] * 4
    buckets = [at.Bucket(g, i) for i, g in enumerate(groups)]
    assert torch.equal(flat(model), before)  # values kept
    model(torch.randn(3, 16)).sum().backward()
    for b in buckets:
        for i, p in enumerate(b.tensors):
            off = b.offsets[i]
            assert p.data_ptr() == b.params.data_ptr() + 4 * off
            assert p.grad.data_ptr() == b.grads.data_ptr() + 4 * off
            assert torch.equal(b.grads[off:off + p.numel()], p.grad.reshape(-1))
        b.params.fill_(0.5)  # through the bucket
        assert all(bool((p == 0.5).all()) for p in b.tensors)
        assert b.host_params.data_ptr() == b.params.data_ptr()  # float32 CPU: the worker pulls in place


def test_default_bucket_cap_is_a_quarter_of_a_small_model_and_25_mib_of_a_large_one():
    mib = 1 << 20
    assert at.bucket_cap_bytes(400 * mib) == 25 * mib             # DDP's size for a large model
    assert at.bucket_cap_bytes(42 * mib) == int(42 * mib / 4)      # at least 4 buckets' worth
    assert at.bucket_cap_bytes(2 * mib) == mib                     # never below 1 MiB
    assert at.bucket_cap_bytes(42 * mib, 25) == 25 * mib           # a number is taken as given
    assert at.bucket_cap_bytes(42 * mib, 0) == at.bucket_cap_bytes(42 * mib, None) == 0
    with pytest.raises(ValueError, match="bucket_cap_mb = 'big'"):
        at.bucket_cap_bytes(mib, "big")
    with pytest.raises(ValueError, match="bucket_cap_mb = -1"):
        at.bucket_cap_bytes(mib, -1)
    # The rule applied: an MLP of 4 layers of 1 MiB (4 MiB) gets buckets of a layer by default, so its
    # layers' gradients go out in four buckets; 25 MiB would have made one.
    model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)])
    auto = at.partition(model)
    assert len(auto) == 4 and [sorted(n for n, _ in g)[0][0] for g in auto] == ["3", "2", "1", "0"]
    assert len(at.partition(model, 25)) == 1


def test_bucket_addresses_are_the_cpp_adapters():
    # adapt::bucket_addresses (update_builder.hpp), which adapt/torch.hpp uses too.
    assert at.bucket_addresses(["h:7000", "g:7001"], 0, False) == ["h:7000", "g:7001"]
    assert at.bucket_addresses(["h:7000", "g:7001"], 2, False) == ["h:7004", "g:7005"]
    assert at.bucket_addresses(["[::1]:7000"], 1, False) == ["[::1]:7001"]
    assert at.bucket_addresses(["server0"], 3, True) == ["server0/b3"]
    with pytest.raises(ValueError, match="bucket_addresses.addresses"):
        at.bucket_addresses(["nohost"], 1, False)


def test_one_bucket_per_dtype_and_a_bf16_bucket_is_staged():
    model = mlp()
    model[4].to(torch.bfloat16)
    groups = at.partition(model, bucket_cap_mb=0)
    assert [sorted({p.dtype for _, p in g}) for g in groups] == [[torch.bfloat16], [torch.float32]]
    b = at.Bucket(groups[0])
    assert b.staged and b.host_params.dtype == torch.float32 and b.params.dtype == torch.bfloat16
    assert b.names == ["4.bias", "4.weight"]  # reverse registration order inside a bucket too
    assert model[4].weight.data_ptr() == b.params.data_ptr() + 2 * b.offsets[1]


def run_bsp(workers, steps, bucket_cap_mb, overlap, seed=11, partition_mb=at.DEFAULT_PARTITION_MB):
    """`workers` workers in threads over one InprocFabric, BSP, gradient
    updates (servers: sgd); the final parameters of worker 0 and the server."""
    fabric = ashl.InprocFabric(deterministic=True)
    sjob, wjobs = jobs(workers)
    srv = at.serve(mlp(), sjob, "bsp", "none", optimizer="sgd", lr=0.05, fabric=fabric, background=True,
                   bucket_cap_mb=bucket_cap_mb, partition_mb=partition_mb)
    out, nbuckets = {}, []

    def worker(r):
        model = mlp()
        opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", "none",
                                      update="gradient", job=wjobs[r], fabric=fabric,
                                      bucket_cap_mb=bucket_cap_mb, overlap=overlap, partition_mb=partition_mb)
        nbuckets.append(len(opt.buckets))
        g = torch.Generator().manual_seed(seed + r)
        for _ in range(steps):
            x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        opt.wait()
        out[r] = flat(model)
        opt.leave()

    errors = in_threads(workers, worker, 120)
    srv.join()
    assert not errors, errors
    return out, nbuckets


def test_overlapped_and_serial_bsp_exchanges_give_bit_identical_parameters():
    serial, nb_serial = run_bsp(2, 6, bucket_cap_mb=0, overlap=False)
    overlapped, nb_overlap = run_bsp(2, 6, bucket_cap_mb=2 * KIB, overlap=True)
    assert nb_serial == [1, 1] and min(nb_overlap) >= 3
    assert torch.equal(serial[0], serial[1])
    assert torch.equal(overlapped[0], overlapped[1])
    assert torch.equal(serial[0], overlapped[0])  # bit for bit
    assert not torch.equal(serial[0], flat(mlp()))  # and it trained


def test_a_parameter_larger_than_the_partition_is_cut_across_buckets_that_alias_it():
    model = mlp()
    before = flat(model)
    plan = at.bucket_plan(model, 2 * KIB, partition_mb=KIB)  # 1 KiB: Linear(32, 32)'s weight (4 KiB) in 4
    pieces = [(n, b, s) for g in plan for n, _, b, s in g if n == "2.weight"]
    assert [len(g) for g in plan if g[0][0] == "2.weight"] == [1, 1, 1, 1]  # each piece a bucket alone
    assert pieces == [("2.weight", 256 * i, 256) for i in range(4)]
    assert [(b, s) for g in plan for n, _, b, s in g if n == "0.weight"] == [(0, 256), (256, 256)]
    buckets = [at.Bucket(None, i, _storage=st) for i, st in enumerate(at._alias(plan))]
    assert torch.equal(flat(model), before)  # values kept
    model(torch.randn(3, 16)).sum().backward()
    w = model[2].weight
    cut = [b for b in buckets if any(p is w for p in b.tensors)]
    assert len(cut) == 4 and [b.index for b in cut] == list(range(cut[0].index, cut[0].index + 4))
    for k, b in enumerate(cut):  # piece k: elements [256 k, 256 (k + 1)) of the weight, in place
        assert b.params.data_ptr() == w.data_ptr() + 4 * 256 * k and b.size == 256
        assert b.grads.data_ptr() == w.grad.data_ptr() + 4 * 256 * k
        assert torch.equal(b.grads, w.grad.reshape(-1)[256 * k:256 * (k + 1)])
        b.params.fill_(float(k))  # through the bucket
    assert torch.equal(w.detach().reshape(-1), torch.arange(4).repeat_interleave(256).float())
    with pytest.raises(ValueError, match="partition_mb"):
        at.bucket_plan(model, 2 * KIB, partition_mb=0)
    with pytest.raises(ValueError, match="partition_mb"):
        at.bucket_plan(model, 2 * KIB, partition_mb=-1.0)
    with pytest.raises(ValueError, match="partition_mb"):
        at.bucket_plan(model, 2 * KIB, partition_mb="4")
    assert len(at.bucket_plan(model, 0, partition_mb=KIB)) == 1  # one bucket per dtype: nothing cut


def test_overlapped_and_serial_bsp_give_bit_identical_parameters_with_parameters_cut_across_buckets():
    serial, _ = run_bsp(2, 4, bucket_cap_mb=0, overlap=False)
    cut, nb = run_bsp(2, 4, bucket_cap_mb=2 * KIB, overlap=True, partition_mb=KIB)
    assert min(nb) == 8  # {4.*, 2.bias}, 2.weight in 4, {0.bias}, 0.weight in 2
    assert torch.equal(cut[0], cut[1])
    assert torch.equal(serial[0], cut[0])  # bit for bit
    assert not torch.equal(serial[0], flat(mlp()))


def test_a_checkpoint_written_without_partitioning_restores_only_with_partition_mb_none(tmp_path):
    # docs/torch.md, "Checkpoints": per bucket, so a checkpoint written with
    # partitioning off (2.weight, 4 KiB, one bucket) is restored with
    # partition_mb=None, bit for bit; with partitioning on (2.weight in 4
    # buckets of 1 KiB) it is refused, naming the elements and partition_mb.
    ckpt = str(tmp_path)
    sjob, (wjob,) = jobs(1)
    fabric = ashl.InprocFabric()
    srv = at.serve(mlp(), sjob, "bsp", "none", optimizer="sgd", lr=0.05, fabric=fabric, background=True,
                   bucket_cap_mb=2 * KIB, partition_mb=None, checkpoint_dir=ckpt)
    model = mlp()
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric, bucket_cap_mb=2 * KIB, partition_mb=None)
    assert [b.size for b in opt.buckets] == [164, 1024, 32, 512]
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    opt.wait()
    opt.leave()
    srv.join()  # writes the final checkpoints
    written = [torch.from_numpy(s.parameters().copy()) for s in srv.servers]
    del srv

    other = mlp(seed=9)  # restored values come from the checkpoint, not from this model
    back = at.serve(other, sjob, "bsp", "none", optimizer="sgd", lr=0.05, fabric=ashl.InprocFabric(),
                    background=True, bucket_cap_mb=2 * KIB, partition_mb=None, checkpoint_dir=ckpt, restore=True)
    assert [s.telemetry["restored_version"] for s in back.servers] == [3] * 4
    restored = [torch.from_numpy(s.parameters().copy()) for s in back.servers]
    assert all(torch.equal(a, b) for a, b in zip(written, restored))  # bit for bit
    assert not torch.equal(restored[1], other[2].weight.detach().reshape(-1))  # bucket 1: 2.weight alone
    back.stop()
    back.join()
    del back

    with pytest.raises(ValueError, match=r'bucket1/server-0\.ashlckpt": checkpoint\.elements = 1024: this server\'s '
                                         r'model has 256 elements.*bucket 1 of bucket_plan\(model, bucket_cap_mb=.*, '
                                         r'partition_mb=0\.0009765625\).*partition_mb'):
        at.serve(mlp(), sjob, "bsp", "none", optimizer="sgd", lr=0.05, fabric=ashl.InprocFabric(), background=True,
                 bucket_cap_mb=2 * KIB, partition_mb=KIB, checkpoint_dir=ckpt, restore=True)


def test_a_forward_waits_for_every_bucket_of_a_cut_parameter():
    # Pull replies held 20 ms each on the emulated link: a forward pre-hook
    # that waited for one piece only would find the others in flight.
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs(1)
    srv = at.serve(mlp(), sjob, "bsp", "none", optimizer="sgd", lr=0.05, fabric=fabric, background=True,
                   bucket_cap_mb=2 * KIB, partition_mb=KIB)
    model = mlp()
    down = []
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric, bucket_cap_mb=2 * KIB, partition_mb=KIB,
                                  link=lambda d, n: (down.append(n), threading.Event().wait(0.02)) if d == "down"
                                  else None)
    w = model[2].weight
    mine = [b.index for b in opt.buckets if any(p is w for p in b.tensors)]
    assert len(mine) == 4
    seen = []
    # Registered after the optimizer's pre-hooks, so it runs after them.
    model[2].register_forward_pre_hook(lambda *_: seen.append([opt._ex[bi].arrived.is_set() for bi in mine]))
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    opt.wait()
    assert seen == [[True] * 4] * 3
    t = opt.telemetry
    assert t["bucket_commits"] == 3 * len(opt.buckets)  # the hook readied every piece's bucket
    assert len(down) == 3 * len(opt.buckets)
    opt.leave()
    srv.join()


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.emb = torch.nn.Embedding(10, 8)
        self.mid = torch.nn.Linear(8, 8)
        self.out = torch.nn.Linear(8, 10, bias=False)
        self.out.weight = self.emb.weight  # tied: one parameter, two uses

    def forward(self, i):
        return self.out(torch.tanh(self.mid(self.emb(i))))


def test_hooks_fire_once_per_parameter_with_gradient_accumulation_and_tied_parameters():
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs(1)
    model = Tied()
    srv = at.serve(Tied(), sjob, "bsp", "none", optimizer="sgd", lr=0.1, fabric=fabric, background=True,
                   bucket_cap_mb=KIB / 4)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric, bucket_cap_mb=KIB / 4)
    slots = [n for b in opt.buckets for n in b.names]
    assert sorted(slots) == ["emb.weight", "mid.bias", "mid.weight"]  # out.weight is emb.weight's slot
    assert len(opt.buckets) >= 2
    micro = 3
    for step in range(1, 3):
        opt.zero_grad()
        for k in range(micro):
            i = torch.randint(0, 10, (4,))
            if k < micro - 1:
                with opt.no_sync():
                    model(i).pow(2).mean().backward()
            else:
                # The pull of a bucket committed in this backward may land any
                # time after it: the parameters before it are the reference.
                before = flat(model)
                model(i).pow(2).mean().backward()
        assert dict(opt.hook_calls) == {n: micro * step for n in slots}, dict(opt.hook_calls)
        ref = before - 0.1 * torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        opt.step()
        opt.wait()
        # The summed (tied: both uses) gradient of the three micro-batches, once.
        assert torch.allclose(flat(model), ref, rtol=0, atol=1e-6)
    assert opt.telemetry["bucket_commits"] == 2 * len(opt.buckets)
    opt.leave()
    srv.join()


def test_a_bf16_model_trains_and_a_non_finite_step_is_skipped_and_not_committed():
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs(1)
    model = mlp(dtype=torch.bfloat16)
    srv = at.serve(model, sjob, "bsp", "none", optimizer="model_delta", fabric=fabric, background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", "none", job=wjob,
                                  fabric=fabric)
    assert all(b.dtype == torch.bfloat16 for b in opt.buckets)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(64, 16, generator=g).to(torch.bfloat16)
    y = (x.float() @ torch.randn(16, 4, generator=g)).to(torch.bfloat16)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = (model(x).float() - y.float()).pow(2).mean()  # bf16 forward and backward, f32 loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    opt.wait()
    commits = opt.telemetry["bucket_commits"]
    before = flat(model)
    opt.zero_grad()
    (model(x).float() - y.float()).pow(2).mean().backward()
    model[0].weight.grad[0, 0] = float("inf")  # an overflowed step, as GradScaler would find it
    opt.step()
    assert opt.skipped == 1
    assert opt.telemetry["bucket_commits"] == commits  # not committed
    assert torch.equal(flat(model), before)  # no local step either
    assert opt.iterations == 30
    opt.leave()
    srv.join()
    assert srv.telemetry["core"]["commits_applied"] == commits


def test_torchruns_variables_map_to_servers_and_workers(monkeypatch):
    for v in ("ASHL_ROLE", "ASHL_RANK", "ASHL_NUM_WORKERS", "ASHL_NUM_SERVERS", "ASHL_SERVER_ADDR", "SLURM_PROCID",
              "SLURM_NTASKS"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("ASHL_TOKEN", "secret-secret-secret")
    monkeypatch.setenv("WORLD_SIZE", "5")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "29400")
    monkeypatch.setenv("RANK", "0")
    j = ashl.job()
    assert (j.role, j.rank, j.num_workers, j.num_servers) == ("server", 0, 4, 1)
    assert j.server_addresses == ("10.1.2.3:29401",) and j.token == "secret-secret-secret"
    monkeypatch.setenv("RANK", "3")
    j = ashl.job()
    assert (j.role, j.rank, j.num_workers) == ("worker", 2, 4)
    monkeypatch.setenv("ASHL_NUM_SERVERS", "2")
    j = ashl.job()
    assert (j.role, j.rank, j.num_workers, j.num_servers) == ("worker", 1, 3, 2)
    assert j.server_addresses == ("10.1.2.3:29401", "10.1.2.3:29402")
    assert ashl.job(["--rank", "0"]).rank == 0  # flags still win
    monkeypatch.setenv("RANK", "9")
    with pytest.raises(ValueError, match=r"RANK = '9': must be < WORLD_SIZE \(5\)"):
        ashl.job()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("MASTER_ADDR")
    with pytest.raises(ValueError, match=r"MASTER_ADDR is not set"):
        ashl.job()


def test_slurms_variables_map_to_servers_and_workers(monkeypatch):
    for v in ("ASHL_ROLE", "ASHL_NUM_SERVERS", "ASHL_SERVER_ADDR", "RANK", "WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("ASHL_INSECURE", "1")
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURM_NTASKS", "3")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[07-09,12],cpu1")
    j = ashl.job()
    assert (j.role, j.rank, j.num_workers, j.num_servers) == ("worker", 1, 2, 1)
    assert j.server_addresses == ("gpu07:29501",)
    assert ashl.launcher_flags()[1] == "slurm"
    monkeypatch.setenv("ASHL_ROLE", "server")  # ashl's own variables win over a launcher's
    assert ashl.launcher_flags() == ([], "ashl")


def check_trace(path, buckets):
    with open(path) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in spans}
    assert {"compute", "encode", "commit", "pull"} <= names, names
    for e in spans:
        assert e["dur"] >= 0 and e["ts"] > 1.5e15  # microseconds since the epoch
    per_bucket = {e["args"]["bucket"] for e in spans if e["name"] == "commit"}
    assert per_bucket == set(range(buckets))
    return events


def test_a_trace_file_parses_with_every_buckets_events(tmp_path):
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs(1)
    model = mlp()
    srv = at.serve(model, sjob, "bsp", "none", optimizer="sgd", fabric=fabric, background=True,
                   bucket_cap_mb=2 * KIB)
    path = str(tmp_path / "t.json")
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric, bucket_cap_mb=2 * KIB, trace=path)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(4, 16)).sum().backward()
        opt.step()
    opt.leave()
    srv.join()
    mine = path + ".worker0.json"
    check_trace(mine, len(opt.buckets))
    assert ashl.trace.merge(path) == 1
    check_trace(path, len(opt.buckets))


def run_ucx_job(flags, out, env, attempts=3):
    """two_workers_job.py under `python3 -m ashl.run -s 1 -w 2`. ashl-run
    reserves a block of free consecutive ports (bucket b's servers listen b
    ports above bucket 0's, bucket_addresses) and releases it before the
    servers bind, so a port another process took in between fails the job
    with "Address already in use": the job is then started again."""
    import subprocess
    for _ in range(attempts):
        done = subprocess.run([sys.executable, "-m", "ashl.run", "-s", "1", "-w", "2", "--timeout", "120"] + flags +
                              ["--", sys.executable, os.path.join(HERE, "two_workers_job.py"), str(out)],
                              env=env, capture_output=True, text=True, timeout=180)
        if done.returncode == 0 or "Address already in use" not in done.stdout + done.stderr:
            return done
    return done


@pytest.mark.skipif(not ashl.has_ucx, reason="this build has no UCX")
def test_python_m_ashl_run_starts_a_bucketed_ucx_job_and_merges_its_traces(tmp_path):
    out = tmp_path / "result.json"
    trace = tmp_path / "job.json"
    env = dict(os.environ, UCX_NET_DEVICES="lo", ASHL_TEST_BUCKET_MB=str(16 / 2**20), ASHL_TOKEN="t0ken-t0ken-t0ken-t0ken")
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ashl.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    done = run_ucx_job(["--trace", str(trace)], out, env)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(out.read_text())
    assert r["buckets"] >= 2 and r["commits"] == r["iterations"] == 40
    assert r["last_loss"] < 0.25 * r["first_loss"], r
    events = check_trace(str(trace), r["buckets"])
    assert {e["pid"] for e in events if e["ph"] == "X"} == {0, 1}  # both workers, one row each


@pytest.mark.skipif(not ashl.has_ucx, reason="this build has no UCX")
def test_ashl_runs_overlapped_over_buckets_in_a_ucx_job(tmp_path):
    # An adaptive policy on the per-bucket path across processes: 1 server
    # and 2 workers over UCX (ashl-run), ASHL profiling 4 iterations then AHL
    # with H = 2 (no loss switches to SHL); every bucket commits in the same
    # iterations as the first.
    out = tmp_path / "out.json"
    env = dict(os.environ, UCX_NET_DEVICES="lo", ASHL_TEST_BUCKET_MB=str(16 / 2**20), ASHL_TOKEN="t0ken-t0ken-t0ken-t0ken",
               ASHL_TEST_POLICY=json.dumps({"name": "ashl", "profile_iterations": 4, "h_ahl": 2, "h_shl": 2,
                                            "switch_loss": 0.0, "planner": "uniform"}))
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ashl.__file__)))
    env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
    done = run_ucx_job([], out, env)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(out.read_text())
    # Profiling ends when both workers made 4 commits; a worker that started
    # late (ashl-run starts them together, their imports do not end together)
    # can leave the other in profiling for most of its 40 iterations, so
    # the commits lie between 4 + 36 / 2 (AHL at once) and 40.
    assert r["buckets"] >= 2 and r["stage"] in ("profile", "ahl"), r
    assert r["bucket_commits"] == [r["bucket_commits"][0]] * r["buckets"], r
    assert 4 + (40 - 6) // 2 <= r["commits"] <= 40, r
    assert r["last_loss"] < 0.25 * r["first_loss"], r


@pytest.mark.parametrize("update", ["delta", "gradient"])
def test_every_bucket_follows_the_plans_local_iterations(update):
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs(1)
    model = mlp()
    policy = ashl.Policy("local_sgd", local_steps=3)
    srv = at.serve(mlp(), sjob, policy, "none", optimizer="sgd" if update == "gradient" else "model_delta",
                   lr=0.1, fabric=fabric, background=True, bucket_cap_mb=2 * KIB)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "local_sgd", "none",
                                  update=update, job=wjob, fabric=fabric, bucket_cap_mb=2 * KIB)
    assert len(opt.buckets) >= 3 and opt.plan.local_iterations == 3
    for it in range(1, 10):
        opt.zero_grad()
        model(torch.randn(4, 16)).pow(2).mean().backward()
        opt.step()
        assert opt.commits == it // 3, f"after iteration {it}"
    tel = opt.telemetry
    assert tel["bucket_commits"] == 3 * len(opt.buckets)
    assert all(b["commits"] == 3 for b in tel["buckets"])
    opt.leave()
    srv.join()


def test_a_bucket_past_the_ports_ashl_run_reserved_is_refused_by_name(monkeypatch):
    addrs = ["127.0.0.1:5000", "127.0.0.1:5001"]
    monkeypatch.setenv("ASHL_PORTS_PER_SERVER", "3")
    assert at.bucket_addresses(addrs, 2, inproc=False) == ["127.0.0.1:5004", "127.0.0.1:5005"]
    with pytest.raises(ValueError, match=r"bucket 3: ashl-run reserved ASHL_PORTS_PER_SERVER=3 .*--ports-per-server"):
        at.bucket_addresses(addrs, 3, inproc=False)
    assert at.bucket_addresses(["node"], 7, inproc=True) == ["node/b7"]  # in-process nodes take no ports
    monkeypatch.delenv("ASHL_PORTS_PER_SERVER")
    assert at.bucket_addresses(addrs, 9, inproc=False)[1] == "127.0.0.1:5019"


def test_ashl_run_passes_the_ports_per_server_through():
    done = ashl.run(["/bin/sh", "-c", 'echo "n=$ASHL_PORTS_PER_SERVER"'], servers=2, workers=1, insecure=True,
                    ports_per_server=3, timeout=60, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if "n=" in line]
    assert len(lines) == 3 and all(line.endswith("] n=3") for line in lines), done.stdout + done.stderr
