"""The torchrun drop-in (docs/torch.md, "From DDP to ashl"):
examples/torchrun/ashl_train.py, ddp_train.py with three changed lines,
run under torchrun (2 processes, RANK 0 running the server) gives DDP's loss
trajectory and final model under BSP; ashl_adaptive_train.py (five changed
lines, ASHL) trains; the job's token is made per job and handed over in a
0600 file (never a fixed one), or refused across nodes without ASHL_TOKEN;
DistributedSampler splits as torch's under equal shares and follows the
plan's share and batch size; the loss reaches ADSP/ASHL from loss_fn,
step(loss=) or a closure; model.state_dict() waits for the pull in flight."""
import difflib
import json
import os
import stat
import subprocess
import sys
import time
import types

import pytest
import torch

import ashl
import ashl.torch as at
from ashl import _torchrun
from torch_testing import flat, jobs, mlp

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(HERE, "..", "..", "examples", "torchrun")

# The ashl script's losses and parameters against DDP's: the servers add the
# mean of the workers' deltas (SGD with momentum on each worker's gradient,
# linear in it) where DDP steps on the mean gradient, so the two differ by
# float32 rounding only (seen: <= 1.2e-7 over 16 steps).
TOLERANCE = 1e-5


def changed_lines(a, b):
    """Lines removed or added by `diff -u a b` (a replaced line counts once:
    the larger of the two)."""
    la = open(os.path.join(EXAMPLES, a)).read().splitlines()
    lb = open(os.path.join(EXAMPLES, b)).read().splitlines()
    n = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=la, b=lb, autojunk=False).get_opcodes():
        if op != "equal":
            n += max(i2 - i1, j2 - j1)
    return n


def test_the_ashl_scripts_differ_from_ddps_by_three_and_five_lines():
    assert changed_lines("ddp_train.py", "ashl_train.py") == 3
    assert changed_lines("ddp_train.py", "ashl_adaptive_train.py") == 5


def torchrun(script, out, runtime_dir, timeout=240):
    """`python -m torch.distributed.run --standalone --nproc_per_node=2
    script --out out` with this interpreter and this ashl, on the loopback."""
    os.makedirs(out, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ASHL_")}
    pkg = os.path.dirname(os.path.dirname(os.path.abspath(ashl.__file__)))
    env.update(PYTHONPATH=pkg + os.pathsep + env.get("PYTHONPATH", ""), UCX_NET_DEVICES="lo",
               XDG_RUNTIME_DIR=str(runtime_dir), OMP_NUM_THREADS="1")
    # --redirects/--tee: torch 1.13's torchrun on Python 3.11 fails on its
    # defaults ("0": Std.NONE, which a 3.11 Flag no longer iterates).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--redirects", "1", "--tee", "2", os.path.join(EXAMPLES, script), "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-8000:]
    return [json.load(open(os.path.join(out, f"loss.{r}.json"))) for r in (0, 1)]


@pytest.mark.skipif(not ashl.has_ucx, reason="this build has no UCX")
def test_the_ashl_script_under_torchrun_gives_ddps_loss_trajectory_under_bsp(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    ddp = torchrun("ddp_train.py", tmp_path / "ddp", runtime)
    ours = torchrun("ashl_train.py", tmp_path / "ashl", runtime)
    for r in (0, 1):
        assert len(ours[r]) == len(ddp[r]) == 16, (len(ours[r]), len(ddp[r]))
        diff = max(abs(a - b) for a, b in zip(ours[r], ddp[r]))
        assert diff <= TOLERANCE, (r, diff, ours[r], ddp[r])
    assert ddp[0] != ddp[1]  # each rank saw its own half of the data
    # RANK 0 saved after its last step without wait(): the pulled parameters.
    a = torch.load(str(tmp_path / "ddp" / "model.pt"))
    b = torch.load(str(tmp_path / "ashl" / "model.pt"))
    assert a.keys() == b.keys()
    assert max(float((a[k] - b[k]).abs().max()) for k in a) <= TOLERANCE
    # The token file RANK 0 made is gone; its directory is the user's, 0700.
    d = runtime / f"ashl-{os.getuid()}"
    assert stat.S_IMODE(d.stat().st_mode) == 0o700
    assert list(d.iterdir()) == []


@pytest.mark.skipif(not ashl.has_ucx, reason="this build has no UCX")
def test_the_adaptive_script_trains_under_torchrun_with_ashl(tmp_path):
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    losses = torchrun("ashl_adaptive_train.py", tmp_path / "ashl", runtime)
    for r in (0, 1):
        assert len(losses[r]) >= 8, losses[r]
        assert sum(losses[r][-4:]) < sum(losses[r][:4]), losses[r]
    assert (tmp_path / "ashl" / "model.pt").exists()


# -- the job and its token ----------------------------------------------------

def torchrun_env(rank, world=2, local_world=None, run="run-a", port=29400, **extra):
    env = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank),
           "LOCAL_WORLD_SIZE": str(world if local_world is None else local_world), "MASTER_ADDR": "node0",
           "MASTER_PORT": str(port), "TORCHELASTIC_RUN_ID": run, "TORCHELASTIC_RESTART_COUNT": "0"}
    env.update(extra)
    return env


def test_rank_0_makes_a_token_per_job_and_hands_it_over_in_a_0600_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    monkeypatch.delenv("ASHL_TOKEN", raising=False)
    c0 = _torchrun.contract(torchrun_env(0))
    assert c0.single_node and c0.token_file
    st = os.stat(c0.token_file)
    assert stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(os.path.dirname(c0.token_file)).st_mode) == 0o700
    assert len(c0.worker.token) == 64 and open(c0.token_file).read() == c0.worker.token
    assert "ASHL_TOKEN" not in os.environ
    w = c0.worker
    assert (w.role, w.rank, w.num_workers, w.num_servers, w.insecure) == ("worker", 0, 2, 1, False)
    assert w.server_addresses == ("127.0.0.1:29401",)  # one node: the loopback, the port after torchrun's
    assert [(s.role, s.rank, s.token) for s in c0.servers] == [("server", 0, w.token)]
    c1 = _torchrun.contract(torchrun_env(1))
    assert c1.worker.token == w.token and c1.worker.rank == 1 and c1.servers == () and c1.token_file is None
    # Another job (run id) gets another token: none is fixed.
    other = _torchrun.contract(torchrun_env(0, run="run-b"))
    assert other.worker.token != w.token


def test_the_token_is_asked_for_across_nodes_and_asHL_TOKEN_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with pytest.raises(ValueError, match="ASHL_TOKEN is not set: a job over several nodes"):
        _torchrun.contract(torchrun_env(0, world=4, local_world=2))
    c = _torchrun.contract(torchrun_env(2, world=4, local_world=2, ASHL_TOKEN="0123456789abcdef-given"))
    assert c.worker.token == "0123456789abcdef-given" and c.token_file is None
    assert c.worker.server_addresses == ("node0:29401",) and c.worker.rank == 2 and c.worker.num_workers == 4
    assert not list(tmp_path.glob("ashl-*/*.token"))
    c = _torchrun.contract(torchrun_env(0, ASHL_INSECURE="1"))
    assert c.worker.insecure and c.token_file is None
    with pytest.raises(ValueError, match="RANK is not set"):
        _torchrun.contract({"WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match="ASHL_ROLE = 'server'"):
        _torchrun.contract(dict(torchrun_env(0), ASHL_ROLE="server"))


def test_a_token_directory_or_file_others_may_read_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    d = tmp_path / f"ashl-{os.getuid()}"
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    with pytest.raises(PermissionError, match="mode 0o755"):
        _torchrun.contract(torchrun_env(0))
    d.chmod(0o700)
    path = _torchrun.token_path(torchrun_env(1))
    with open(path, "w") as f:
        f.write("x" * 64)
    os.chmod(path, 0o644)
    with pytest.raises(PermissionError, match="must be 0600"):
        _torchrun.contract(torchrun_env(1))
    os.unlink(path)
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="not written by RANK 0"):
        _torchrun.read_token(path, wait=0.2)
    assert time.monotonic() - t0 < 5


# -- the sampler ----------------------------------------------------------------

def fake_optimizer(rank, workers, share=0.0, batch=0, policy="bsp"):
    plan = types.SimpleNamespace(stage=policy, batch_size=batch)
    return types.SimpleNamespace(job=ashl.Job(rank=rank, num_workers=workers), data_share=share,
                                 _policy=ashl.Policy(policy), plan=plan)


@pytest.mark.parametrize("drop_last", [False, True])
def test_equal_shares_split_as_torchs_distributed_sampler(drop_last):
    data = list(range(103))
    for r in range(3):
        ours = at.DistributedSampler(data, seed=7, drop_last=drop_last, optimizer=fake_optimizer(r, 3, 1 / 3))
        theirs = torch.utils.data.distributed.DistributedSampler(data, num_replicas=3, rank=r, seed=7,
                                                                 drop_last=drop_last)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            theirs.set_epoch(epoch)
            assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_an_unequal_share_takes_its_part_of_the_data_and_batches_follow_the_plan():
    data = list(range(100))
    opt = fake_optimizer(1, 4, share=0.4, policy="ashl")
    s = at.DistributedSampler(data, shuffle=False, optimizer=opt)
    assert list(s) == list(range(25, 65))  # no process group: from its equal-share place, 40 % of the data
    b = at.DistributedSampler(data, shuffle=False, optimizer=opt, batch_size=8)
    assert len(b) == 5
    it = iter(b)
    assert next(it) == list(range(25, 33))
    opt.plan.batch_size = 12  # the plan changed: the next batch follows it
    assert next(it) == list(range(33, 45))
    assert [len(x) for x in it] == [12, 8]
    with pytest.raises(ValueError, match="batch_size = 0"):
        at.DistributedSampler(data, batch_size=0)


# -- the loss, and state_dict -----------------------------------------------------

def one_worker(policy, **kw):
    fabric = ashl.InprocFabric(deterministic=True)
    sjob, wjobs = jobs(1)
    pol = ashl.Policy("ashl", profile_iterations=2, h_ahl=1, h_shl=1, planner="uniform") if policy == "ashl" \
        else ashl.Policy(policy)
    srv = at.serve(mlp(), sjob, pol, "none", optimizer=kw.pop("server_optimizer", "model_delta"), lr=0.1,
                   fabric=fabric, background=True)
    model = mlp()
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, policy, "none", job=wjobs[0],
                                  fabric=fabric, **kw)
    return srv, model, opt


@pytest.mark.parametrize("policy", ["ashl", "bsp"])
def test_the_loss_is_reported_from_loss_fn_step_or_a_closure_when_the_policy_reads_it(policy):
    loss_fn = torch.nn.MSELoss()
    srv, model, opt = one_worker(policy, loss_fn=loss_fn)
    sent = []
    real = opt.report_metric
    opt.report_metric = lambda name, value: (sent.append((name, value)), real(name, value))
    try:
        g = torch.Generator().manual_seed(3)
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        expected = []
        for how in ("loss_fn", "step", "closure"):
            opt.zero_grad()
            if how == "closure":
                def closure():
                    loss = ((model(x) - y) ** 2).mean()
                    loss.backward()
                    return loss
                expected.append(opt.step(closure).item())
                continue
            loss = loss_fn(model(x), y) if how == "loss_fn" else ((model(x) - y) ** 2).mean()
            loss.backward()
            with torch.no_grad():
                loss_fn(model(x), y * 3)  # an evaluation before step(): not the training loss
            expected.append(loss.item())
            opt.step(loss=loss) if how == "step" else opt.step()
    finally:
        opt.leave()
        srv.join()
    assert sent == ([("loss", v) for v in expected] if policy == "ashl" else [])


def test_state_dict_waits_for_the_pull_in_flight():
    # update="gradient": the worker does not step locally, so until the pull
    # lands the model holds the old parameters; a late pull (0.3 s) shows a
    # state_dict() that did not wait.
    def late(direction, nbytes):
        if direction == "down":
            time.sleep(0.3)
    srv, model, opt = one_worker("bsp", update="gradient", server_optimizer="sgd", link=late)
    try:
        before = flat(model)
        x, y = torch.randn(8, 16), torch.randn(8, 4)
        opt.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).clone()
        opt.step()
        sd = model.state_dict()
        saved = torch.cat([v.reshape(-1) for v in sd.values()]).clone()
    finally:
        opt.leave()
        srv.join()
    assert torch.allclose(saved, before - 0.1 * grad, atol=1e-6), float((saved - (before - 0.1 * grad)).abs().max())
