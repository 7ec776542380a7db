"""ashl.torch through the Python module (docs/torch.md): the bucket views,
plain SGD bit for bit, the plan followed, a two-worker UCX job whose loss
falls, and bad arguments named in the exception."""
import json
import os
import sys

import numpy as np
import pytest
import torch

import ashl
import ashl.torch as at
from torch_testing import flat, jobs

HERE = os.path.dirname(os.path.abspath(__file__))


def tiny_model(seed=7):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def test_bucket_views_alias_parameters_and_gradients():
    model = tiny_model()
    before = flat(model)
    b = at.Bucket(model)
    assert b.size == before.numel() == 53
    assert torch.equal(b.params, before)  # values kept
    b.params[0] = 42.0  # through the bucket
    assert model[0].weight[0, 0].item() == 42.0
    with torch.no_grad():
        model[2].bias.fill_(-3.0)  # through the parameter
    assert torch.equal(b.params[-3:], torch.full((3,), -3.0))
    model(torch.randn(4, 6)).sum().backward()
    assert model[2].bias.grad.data_ptr() == b.grads[-3:].data_ptr()
    assert torch.equal(b.grads[-3:], torch.full((3,), 4.0))
    model[2].bias.grad = None  # zero_grad(set_to_none=True) does this
    b.attach()
    assert model[2].bias.grad.data_ptr() == b.grads[-3:].data_ptr()


def test_bsp_identity_sgd_over_inproc_is_plain_sgd_bit_for_bit():
    lr = 0.1
    model, ref = tiny_model(), tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", "none", optimizer="sgd", lr=lr, fabric=fabric, background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric)
    assert opt.plan.local_iterations == 1 and opt.plan.stage == "bsp"
    torch.manual_seed(3)
    for _ in range(5):
        x, y = torch.randn(8, 6), torch.randn(8, 3)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.wait()  # the pull in flight (a forward pre-hook would wait for it)
        for p in ref.parameters():
            p.grad = None
        torch.nn.functional.mse_loss(ref(x), y).backward()
        with torch.no_grad():  # plain SGD in float32: W - lr * g
            for p in ref.parameters():
                p.copy_(torch.from_numpy(p.numpy() - np.float32(lr) * p.grad.numpy()))
        assert all(torch.equal(a, b) for a, b in zip(model.parameters(), ref.parameters()))
    assert opt.commits == 5
    opt.leave()
    srv.join()
    assert srv.telemetry["core"]["commits_applied"] == 5


def test_delta_updates_with_one_worker_follow_the_local_optimizer():
    model, ref = tiny_model(), tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", fabric=fabric, background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), model, "bsp",
                                  job=wjob, fabric=fabric)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for _ in range(4):
        x = torch.randn(8, 6)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        opt.wait()
        ref_opt.zero_grad()
        ref(x).pow(2).mean().backward()
        ref_opt.step()
        # W + (W' - W) on the server: equal up to rounding
        assert torch.allclose(flat(model), flat(ref), rtol=0, atol=1e-6)
    opt.leave()
    srv.join()


def test_a_link_hold_gets_every_commit_and_reply_with_its_bytes_and_the_server_gives_its_parameters():
    # worker_params::link_hold through the binding: called "up" before each
    # commit is sent and "down" after each reply arrived, with the header and
    # payload bytes; the time it holds is the telemetry's link_seconds. The
    # server's parameters() while it serves equal what the worker pulled.
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", "none", fabric=fabric, background=True)
    calls = []

    def link(direction, nbytes):
        calls.append((direction, nbytes))
        import time
        time.sleep(0.01)

    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  job=wjob, fabric=fabric, overlap=False, link=link)
    calls.clear()  # the join's first pull (a reply) may or may not have been held yet
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 6)).pow(2).mean().backward()
        opt.step()
    dense = 53 * 4
    assert [d for d, _ in calls] == ["up", "down"] * 3
    assert all(b > dense for _, b in calls) and all(b - dense < 200 for _, b in calls)  # payload + one header
    assert opt.telemetry["link_seconds"] >= 0.06
    served = srv.parameters()
    assert np.array_equal(served, opt._buckets[0].host_params.numpy())
    opt.leave()
    srv.join()
    assert np.array_equal(srv.parameters(), served)  # after join: read directly


def test_a_link_hold_does_not_deadlock_with_a_thread_reading_the_worker():
    # The hold runs under the worker's lock and takes the GIL; every binding
    # call that takes the lock releases the GIL first, so a Python thread
    # reading plan and telemetry while the communication threads commit and
    # pull (overlap=True) does not deadlock with them.
    import threading
    import time
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", "none", fabric=fabric, background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  job=wjob, fabric=fabric, overlap=True,
                                  link=lambda direction, nbytes: time.sleep(0.005))
    stop = threading.Event()
    reads = []

    def reader():
        while not stop.is_set():
            reads.append((opt.plan.stage, opt.telemetry["commits"], opt.batch_size))

    t = threading.Thread(target=reader, daemon=True)
    t.start()

    def train():
        for _ in range(10):
            opt.zero_grad()
            model(torch.randn(8, 6)).pow(2).mean().backward()
            opt.step()
        opt.wait()

    trainer = threading.Thread(target=train, daemon=True)
    trainer.start()
    trainer.join(timeout=30)
    stop.set()
    t.join(timeout=5)
    assert not trainer.is_alive(), "training deadlocked with the reader"
    assert reads and opt.commits == 10
    opt.leave()
    srv.join()


def test_an_exception_in_the_link_hold_is_raised_by_the_call_that_held():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", "none", fabric=fabric, background=True)
    armed = []

    def link(direction, nbytes):
        if armed:
            raise OSError("emulated link broke")

    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  job=wjob, fabric=fabric, overlap=False, link=link)
    armed.append(1)
    model(torch.randn(8, 6)).pow(2).mean().backward()
    with pytest.raises(RuntimeError, match="worker.link raised.*emulated link broke"):
        opt.step()
    srv.stop()
    srv.join()


def test_the_plans_local_iterations_and_batch_size_are_followed():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, ashl.Policy("local_sgd", local_steps=3, batch_size=16), fabric=fabric,
                   background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "local_sgd",
                                  batch_size=4, job=wjob, fabric=fabric)
    assert opt.plan == ashl.Plan(local_iterations=3, batch_size=16, stage="local_sgd", data_share=opt.plan.data_share)
    assert opt.batch_size == 16  # the plan's, not the worker's own 4
    for it in range(1, 10):
        x = torch.randn(opt.batch_size, 6)
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        before = flat(model)
        opt.step()
        opt.wait()
        assert opt.commits == it // 3, f"after iteration {it}"
        assert not torch.equal(flat(model), before)
    assert opt.telemetry["commits"] == 3
    opt.leave()
    srv.join()


def test_a_non_finite_update_is_refused_before_any_server_applies_it_and_named():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "bsp", "none", optimizer="sgd", lr=0.1, fabric=fabric, background=True,
                   store_bytes=0, max_commit_samples=1 << 20)
    # Committed in step(), not during backward (overlap=False), so the NaN
    # set after backward is what the server receives.
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", "none",
                                  update="gradient", job=wjob, fabric=fabric, overlap=False)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).mean().backward()
        opt.step()
    opt.zero_grad()
    model(torch.randn(4, 6)).pow(2).mean().backward()
    model[2].bias.grad[1] = float("nan")  # element 1 of the bucket (its parameters lie in reverse order)
    with pytest.raises(Exception) as e:
        opt.step()
        opt.wait()  # the overlapped exchange answers when its pull is waited for
    # The worker runs the servers' value rule over every shard's part before
    # it sends any (rules/commit_check.hpp), so nothing reaches a server.
    assert "commit.payload[1] = nan" in str(e.value) and "no part of it was sent" in str(e.value)
    srv.stop()
    srv.join()
    core = srv.telemetry["core"]
    assert core["commits_applied"] == 2
    assert core["refused"] == 0


def test_server_limits_are_arguments():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, _ = jobs()
    with pytest.raises(Exception, match=r"server_core.store_bytes = 100: holds less than one dense f32 commit"):
        at.serve(model, sjob, "bsp", fabric=fabric, background=True, store_bytes=100)


def test_a_float64_parameter_is_named():
    model = tiny_model().double()
    with pytest.raises(ValueError, match=r"parameter '0.weight'.dtype = torch.float64"):
        at.Bucket(model)


def test_a_non_contiguous_parameter_is_named():
    w = torch.nn.Parameter(torch.randn(4, 3).t())
    with pytest.raises(ValueError, match=r"parameter 'w'.stride = \(1, 3\)"):
        at.Bucket([("w", w)])


def test_a_model_of_another_size_than_the_servers_is_named():
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(torch.nn.Linear(3, 3), sjob, "bsp", fabric=fabric, background=True)  # 12 elements
    model = tiny_model()  # 53
    # The model's size is part of the job id: the join is refused naming both ids and the server's shape.
    other = ashl._ashl.make_job_id("", 53, 1, 1)
    with pytest.raises(Exception, match=rf"join.job = 0x{other:016x}: .*a model of 12 elements"):
        at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job=wjob, fabric=fabric,
                                timeout=5.0)
    srv.stop()
    srv.join()


def test_the_job_id_counts_max_workers_as_cpp_does(monkeypatch):
    """docs/elastic.md §2.2 (E2b): ASHL_MAX_WORKERS is read as ps/launch.hpp
    reads it, and _job_id counts the job's maximum as ps::job_id_of does: not
    said, it is the worker count and the id is the one the job had before
    there was a maximum (pinned as test/ps/launch.cpp pins it)."""
    for v in ("ASHL_NUM_SERVERS", "ASHL_TOKEN", "ASHL_MAX_WORKERS", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    for k, v in {"ASHL_ROLE": "worker", "ASHL_RANK": "3", "ASHL_NUM_WORKERS": "4", "ASHL_INSECURE": "1",
                 "ASHL_JOB": "resnet", "ASHL_SERVER_ADDR": "10.0.0.1:5000"}.items():
        monkeypatch.setenv(k, v)
    today = 0xa9057d4019128d31  # make_job_id("resnet", 100, 4, 1) before max_workers existed
    j = ashl.job()
    assert (j.num_workers, j.max_workers) == (4, 4)
    assert at._job_id(j, 100) == today
    assert at._job_id(ashl.Job(name="resnet", num_workers=4), 100) == today  # max_workers 0: the worker count
    monkeypatch.setenv("ASHL_MAX_WORKERS", "8")
    j = ashl.job(["--rank", "6"])  # a rank past the initial workers
    assert (j.rank, j.num_workers, j.max_workers) == (6, 4, 8)
    assert at._job_id(j, 100) == ashl._ashl.make_job_id("resnet", 100, 8, 1) != today
    assert at._job_id(ashl.Job(name="resnet", num_workers=4, max_workers=8), 100) == at._job_id(j, 100)
    with pytest.raises(ValueError, match=r"--rank = 8: must be < ASHL_MAX_WORKERS = 8"):
        ashl.job(["--rank", "8"])
    monkeypatch.setenv("ASHL_MAX_WORKERS", "3")
    with pytest.raises(ValueError, match=r"ASHL_MAX_WORKERS = '3': must be 0 \(the same as ASHL_NUM_WORKERS\) "
                                         r"or at least ASHL_NUM_WORKERS = 4"):
        ashl.job()


def test_ashl_run_passes_max_workers_to_every_process(capfd):
    """ashl.run(max_workers=) and python3 -m ashl.run --max-workers reach every
    process as ASHL_MAX_WORKERS (ashl-run --max-workers)."""
    import ashl.run as run_module
    script = ["/bin/sh", "-c", "echo max=${ASHL_MAX_WORKERS-unset}"]
    done = ashl.run(script, servers=1, workers=2, insecure=True, max_workers=5, capture_output=True, text=True)
    lines = done.stdout.splitlines()
    assert len(lines) == 3 and all(line.endswith("] max=5") for line in lines), done.stdout
    assert run_module.main(["-s", "1", "-w", "1", "--insecure", "--max-workers", "3", "--"] + script) == 0
    out = capfd.readouterr().out
    assert out.count("max=3") == 2, out


def test_a_rank_past_the_initial_workers_joins_a_server_with_max_workers():
    """serve() passes the job's maximum to the server: rank 1 of a 1-worker
    job of at most 2 joins and trains; without the maximum it is refused by
    name, naming ASHL_MAX_WORKERS."""
    model = tiny_model()
    for max_workers in (2, 0):
        fabric = ashl.InprocFabric()
        sjob = ashl.Job(role="server", num_workers=1, max_workers=max_workers, server_addresses=("server0",),
                        insecure=True)
        wjob = ashl.Job(role="worker", rank=1, num_workers=1, max_workers=max_workers, server_addresses=("server0",),
                        insecure=True)
        # Rank 0 never comes: the server ends no_worker_grace after the joiner left.
        srv = at.serve(model, sjob, "asp", "none", optimizer="sgd", lr=0.1, fabric=fabric, background=True,
                       no_worker_grace=0.5)
        wmodel = tiny_model()
        if max_workers:
            opt = at.DistributedOptimizer(torch.optim.SGD(wmodel.parameters(), lr=0.1), wmodel, "asp", "none",
                                          update="gradient", job=wjob, fabric=fabric, timeout=5.0)
            wmodel(torch.ones(2, 6)).sum().backward()
            opt.step()
            opt.wait()
            assert opt.commits == 1
            opt.leave()
            srv.join()
            assert srv.telemetry["core"]["commits_applied"] == 1
        else:
            with pytest.raises(Exception, match=r"join.rank = 1: this job admits at most 1 workers "
                                                r"\(ranks 0..0; ASHL_MAX_WORKERS\)"):
                at.DistributedOptimizer(torch.optim.SGD(wmodel.parameters(), lr=0.1), wmodel, "asp", "none",
                                        update="gradient", job=wjob, fabric=fabric, timeout=5.0)
            srv.stop()
            srv.join()


def test_a_worker_gets_a_fresh_incarnation_and_the_server_says_why_it_ended():
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    model = torch.nn.Linear(3, 3)
    srv = at.serve(model, sjob, "asp", fabric=fabric, background=True, no_worker_grace=0.3)
    a = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, job=wjob, fabric=fabric,
                                timeout=5.0)
    first = a.worker.incarnation
    assert first > ashl._ashl.fresh_incarnation() - (1 << 40)  # from the clock, not 0
    a.leave()
    srv.join()  # every rank left
    assert srv.ended == "all_left"
    srv = at.serve(model, sjob, "asp", fabric=ashl.InprocFabric(), background=True, no_worker_grace=0.3)
    srv.join()  # nobody: ends after the grace
    assert srv.ended == "no_worker"


def test_a_policy_or_codec_other_than_the_servers_is_named():
    model = tiny_model()
    fabric = ashl.InprocFabric()
    sjob, (wjob,) = jobs()
    srv = at.serve(model, sjob, "ssp", "topk", fabric=fabric, background=True)
    with pytest.raises(ValueError, match=r"policy = 'bsp': the servers run stage 'ssp'"):
        at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "bsp", job=wjob, fabric=fabric)
    srv.stop()
    srv.join()
    # The servers name their codec in the first plan that compresses: ASHL's
    # after its profiling iterations (ratio 0.1 here).
    fabric = ashl.InprocFabric()
    srv = at.serve(model, sjob, ashl.Policy("ashl", compression_ratio=0.1, profile_iterations=2), "topk",
                   fabric=fabric, background=True)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, "ashl", "qsgd", job=wjob,
                                  fabric=fabric)
    with pytest.raises(ValueError, match=r"compression = 'qsgd': the servers' codec is 'topk'"):
        for _ in range(20):
            opt.zero_grad()
            model(torch.randn(4, 6)).pow(2).mean().backward()
            opt.step()
    srv.stop()
    srv.join()


def test_bad_arguments_are_named():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"update = 'grads'"):
        at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, update="grads")
    with pytest.raises(ValueError, match=r"policy.h_ahll = \"3\": unknown policy parameter"):
        at.serve(model, jobs()[0], ashl.Policy("ashl", h_ahll=3), fabric=ashl.InprocFabric())
    with pytest.raises(ValueError, match=r"sync.policy = \"bspp\": unknown policy"):
        at.serve(model, jobs()[0], "bspp", fabric=ashl.InprocFabric())
    with pytest.raises(ValueError, match=r"parameters.dtype = \"float64\": must be float32"):
        ashl.Worker(np.zeros(4), ["server0"], fabric=ashl.InprocFabric())


def test_the_job_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ASHL_ROLE", "worker")
    monkeypatch.setenv("ASHL_RANK", "1")
    monkeypatch.setenv("ASHL_NUM_WORKERS", "2")
    monkeypatch.setenv("ASHL_SERVER_ADDR", "127.0.0.1:5000")
    monkeypatch.setenv("ASHL_TOKEN", "secret-secret-secret")
    j = ashl.job()
    assert (j.role, j.rank, j.num_workers, j.num_servers) == ("worker", 1, 2, 1)
    assert j.server_addresses == ("127.0.0.1:5000",) and j.token == "secret-secret-secret"
    assert "secret" not in repr(j)
    monkeypatch.setenv("ASHL_RANK", "7")
    with pytest.raises(ValueError, match=r"ASHL_RANK = 7"):
        ashl.job()


@pytest.mark.skipif(not ashl.has_ucx, reason="this build has no UCX")
def test_two_workers_over_ucx_loopback_train_and_the_loss_falls(tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ, UCX_NET_DEVICES="lo")
    done = ashl.run([sys.executable, os.path.join(HERE, "two_workers_job.py"), str(out)], servers=1, workers=2,
                    timeout=120, env=env, check=False, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    r = json.loads(out.read_text())
    assert r["commits"] == r["iterations"] == 40
    assert r["last_loss"] < 0.25 * r["first_loss"], r


def test_the_job_reads_backup_addresses_and_buckets_place_them(monkeypatch):
    """docs/elastic.md §4.6 (E11): ASHL_BACKUP_ADDR as ps/launch.hpp reads it
    (shard 0's with port + i, or a list with empty entries), ASHL_REPLICA,
    and each bucket's backups placed as its servers are."""
    for v in ("ASHL_TOKEN", "ASHL_MAX_WORKERS", "ASHL_BACKUP_ADDR", "ASHL_REPLICA", "ASHL_PORTS_PER_SERVER",
              "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(v, raising=False)
    for k, v in {"ASHL_ROLE": "worker", "ASHL_NUM_SERVERS": "2", "ASHL_INSECURE": "1",
                 "ASHL_SERVER_ADDR": "10.0.0.1:5000", "ASHL_BACKUP_ADDR": "10.0.0.2:6000"}.items():
        monkeypatch.setenv(k, v)
    j = ashl.job()
    assert j.backup_addresses == ("10.0.0.2:6000", "10.0.0.2:6001")
    assert not j.replica
    assert at._bucket_backups(j, 1, False) == ["10.0.0.2:6002", "10.0.0.2:6003"]
    monkeypatch.setenv("ASHL_BACKUP_ADDR", ",10.0.0.2:6001")
    j = ashl.job()
    assert j.backup_addresses == ("", "10.0.0.2:6001")
    assert at._bucket_backups(j, 1, False) == ["", "10.0.0.2:6003"]
    assert at._bucket_backups(ashl.Job(server_addresses=("h:1",)), 1, False) == []
    monkeypatch.setenv("ASHL_REPLICA", "1")
    with pytest.raises(ValueError, match=r"ASHL_REPLICA = '1': only a server is a backup \(ASHL_ROLE = worker\)"):
        ashl.job()
