"""Adaptive policies (ASHL, ADSP, DLB) on the overlapped per-bucket path
(docs/torch.md "Buckets and overlap (Python)"): the buckets are many, every bucket's worker runs the first
bucket's cycle (its plan, adopted at the cycle start, and its end: a
ps::worker follower each), so H local steps, commit intervals, batches and
compression ratios are one for the whole model; with one worker the
overlapped exchange gives the serial one's parameters bit for bit. Servers
are real ps::servers in this process (InprocFabric)."""
import threading
import time

import pytest
import torch

import ashl
import ashl.torch as at
from torch_testing import KIB, flat, in_threads, jobs, mlp


def run(policy, workers, steps, *, update, overlap=True, cap=2 * KIB, compression="none", sleep=0.0,
        on_step=None, seed=11, follows=None, device_encode=None, until_stage=None, then=0):
    """`workers` workers in threads against in-process servers; returns, per
    worker, (final parameters, optimizer) after the optimizer left. With
    `until_stage`, the workers start together and a worker whose plan has
    not reached that stage after `steps` steps goes on (up to 500 steps
    more) until it has, then runs `then` steps more: a plan comes when the
    server has every worker's profile, which on a loaded machine can be
    after a fast thread's last planned step."""
    start = threading.Barrier(workers)
    fabric = ashl.InprocFabric(deterministic=True)
    sjob, wjobs = jobs(workers)
    optimizer = "sgd" if update == "gradient" else "model_delta"
    srv = at.serve(mlp(), sjob, policy, compression, optimizer=optimizer, lr=0.05, fabric=fabric, background=True,
                   bucket_cap_mb=cap)
    out = {}

    def worker(r):
        model = mlp()
        opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5), model, policy,
                                      compression, update=update, job=wjobs[r], fabric=fabric, bucket_cap_mb=cap,
                                      overlap=overlap, batch_size=8, device_encode=device_encode)
        if follows is not None:
            watch_follows(opt, follows)
        g = torch.Generator().manual_seed(seed + r)
        if until_stage:
            start.wait(60)
        step, reached = 0, None  # reached: the step count when the plan first was until_stage
        while step < steps or (until_stage and step < steps + 500 and (reached is None or step < reached + then)):
            n = opt.batch_size
            x, y = torch.randn(n, 16, generator=g), torch.randn(n, 4, generator=g)
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            if sleep:
                time.sleep(sleep)
            if on_step:
                on_step(r, step, opt)
            step += 1
            if until_stage and reached is None and opt.plan.stage == until_stage:
                reached = step
        opt.wait()
        out[r] = (flat(model), opt, opt.telemetry)
        opt.leave()

    errors = in_threads(workers, worker, 180)
    srv.join()
    assert not errors, errors
    return out, srv


def watch_follows(opt, log):
    """Records, each time a follower bucket counts an iteration, the leader's
    plan of the cycle and the plan, batch and codec the follower then runs."""
    count = opt._cycle_done

    def counted(bi):
        done = count(bi)
        if bi > 0:
            lead, w = opt._lead[0], opt._ex[bi].worker
            log.append(((lead.plan, lead.codec), (w.plan, w.codec), (lead.plan["batch_size"], w.batch)))
        return done
    opt._cycle_done = counted


def same_schedule(run_a, run_b, tries=5):
    """Runs both until they committed in the same iterations, and returns
    their results. A new plan (ASHL's switch from profiling to AHL) is
    adopted at the cycle after the plan_update arrived: when it overtakes the
    pull reply, that is the next cycle, else the one after (ps::worker,
    docs/ps.md "Plan authority"), in the serial and the overlapped exchange
    alike; bit-identity holds between runs that adopted it at the same cycle."""
    for _ in range(tries):
        sched_a, sched_b = [], []
        a = run_a(lambda r, step, opt: sched_a.append(opt.commits))
        b = run_b(lambda r, step, opt: sched_b.append(opt.commits))
        if sched_a == sched_b:
            return a, b
    raise AssertionError(f"no two runs of {tries} committed in the same iterations: {sched_a} {sched_b}")


def lockstep(opt, tel, follows=None):
    """Every bucket's worker committed as often as the first, and ran the
    first one's plan in every cycle (a new plan is adopted by the leader at
    its cycle start and by the followers at their cycle's first iteration,
    so between cycles their plans may differ)."""
    per = [b["commits"] for b in tel["buckets"]]
    assert len(per) == len(opt.buckets) >= 3
    assert per == [per[0]] * len(per), per
    for lead, follower, _ in follows or []:
        assert follower == lead
    return per[0]


@pytest.mark.parametrize("update", ["delta", "gradient"])
def test_ashl_overlapped_over_buckets_gives_the_serial_exchange_bit_for_bit(update):
    # One worker: the order of the servers' updates is fixed. Profiling for 2
    # iterations (a commit each), then AHL with H = 3 (uniform planner).
    policy = ashl.Policy("ashl", profile_iterations=2, h_ahl=3, h_shl=2, planner="uniform")
    steps = 14
    follows = []

    def overlapped(on_step):
        follows.clear()
        return run(policy, 1, steps, update=update, overlap=True, follows=follows, on_step=on_step)
    (serial, _), (over, srv) = same_schedule(lambda on_step: run(policy, 1, steps, update=update, overlap=False,
                                                                 cap=0, on_step=on_step), overlapped)
    (p_serial, o_serial, t_serial), (p_over, o_over, t_over) = serial[0], over[0]
    assert len(o_serial.buckets) == 1
    commits = lockstep(o_over, t_over, follows)
    assert len(follows) == steps * (len(o_over.buckets) - 1)
    assert {f[0][0]["stage"] for f in follows} == {"profile", "ahl"}  # the plan changed, and was followed
    assert o_over.plan.stage == "ahl" and o_over.plan.local_iterations == 3
    # 2 (or 3) profiling commits, then one per 3 iterations: the plan's H was followed by every bucket.
    assert commits == t_serial["commits"] in (2 + (steps - 2) // 3, 3 + (steps - 3) // 3)
    assert torch.equal(p_serial, p_over)  # bit for bit
    assert not torch.equal(p_over, flat(mlp()))
    # The followers took their servers' plans as ignored: AHL's plans came from bucket 0's server.
    assert all(b["plans_ignored"] >= 1 for b in t_over["buckets"][1:])
    assert t_over["buckets"][0]["plans_ignored"] == 0
    # Every bucket's servers took the leader's measurements as the worker's.
    for s in srv.servers:
        assert s.telemetry["core"]["refused_by_reason"]["measurement"] == 0


def test_ashl_two_workers_compress_every_bucket_with_the_plans_ratio():
    policy = ashl.Policy("ashl", profile_iterations=2, h_ahl=2, h_shl=2, compression_ratio=0.25, planner="uniform")
    follows, at_ahl = [], {}

    def on_step(r, step, opt):  # each bucket's (commits, bytes out) when the plan became AHL
        if r not in at_ahl and opt.plan.stage == "ahl":
            at_ahl[r] = [(b["commits"], b["bytes_out"]) for b in opt.telemetry["buckets"]]
    # 12 steps, or until the plan is AHL and then 10 steps more (5 compressed commits).
    out, _ = run(policy, 2, 12, update="gradient", compression="topk", follows=follows, until_stage="ahl", then=10,
                 on_step=on_step)
    dense_policy = ashl.Policy("ashl", profile_iterations=2, h_ahl=2, h_shl=2, compression_ratio=1.0,
                               planner="uniform")
    dense, _ = run(dense_policy, 2, 12, update="gradient", compression="topk", until_stage="ahl", then=10)
    assert {f[0][1] for f in follows} == {"identity", "topk"}  # profiling dense, AHL compressed
    for r, (params, opt, tel) in out.items():
        commits = lockstep(opt, tel, follows)
        assert opt.plan.stage == "ahl" and opt.plan.compression_ratio == pytest.approx(0.25)
        # Two workers: profiling ends when both made 2 commits and sent their
        # measurements (one may go on profiling while it waits for the
        # other), then H = 2 per commit.
        n = opt.iterations
        assert n >= 12 and 2 + (n - 2) // 2 <= commits <= n - 1, (n, commits)
        d_opt, d_tel = dense[r][1], dense[r][2]
        lockstep(d_opt, d_tel)
        big = 0
        for ex, b, db, (c0, b0) in zip(opt._ex, tel["buckets"], d_tel["buckets"], at_ahl[r]):
            assert ex.worker.codec == "topk"
            assert b["compress_seconds"] > 0  # each bucket encoded its commits with the plan's codec
            assert db["compress_seconds"] == 0
            if ex.bucket.size >= 512:
                # Top-k of a quarter: fewer bytes per commit than dense, over the
                # commits since the plan became AHL (a worker that waited long for
                # the other's profile made many dense ones before).
                big += 1
                assert b["commits"] - c0 >= 4, (b["commits"], c0)
                per, dense_per = (b["bytes_out"] - b0) / (b["commits"] - c0), db["bytes_out"] / db["commits"]
                assert per < 0.9 * dense_per, (per, dense_per)
        assert big >= 2
        assert torch.isfinite(params).all()


def test_adsp_commit_interval_is_the_first_buckets_for_every_bucket():
    # ADSP: commits by time (Γ / ΔC - O_i); 2 workers, Γ = 0.3 s, steps of ~25 ms.
    policy = ashl.Policy("adsp", period=0.3, initial_commit_rate=1, max_commit_rate=1)
    seen, follows = [], []

    def on_step(r, step, opt):
        opt.report_metric("loss", 1.0 / (1 + step))
        seen.append(opt.plan.commit_interval)

    steps = 40
    out, _ = run(policy, 2, steps, update="delta", sleep=0.025, on_step=on_step, follows=follows)
    for r, (params, opt, tel) in out.items():
        commits = lockstep(opt, tel, follows)
        assert opt.plan.local_iterations == 0 and opt.plan.commit_interval > 0
        assert 1 <= commits < steps / 2  # interval-driven: several iterations per commit
        assert opt.iterations == steps
    assert max(seen) > 0.05


def test_dlb_batches_of_the_plan_are_every_buckets():
    policy = ashl.Policy("dlb", total_batch=32, min_batch=4)
    batches, follows = [], []
    out, _ = run(policy, 2, 10, update="gradient", on_step=lambda r, s, opt: batches.append(opt.batch_size),
                 follows=follows)
    for r, (params, opt, tel) in out.items():
        commits = lockstep(opt, tel, follows)
        assert commits == 10  # BSP rounds: one commit per iteration
    assert all(4 <= b <= 28 for b in batches)
    assert all(lead_batch == batch for _, _, (lead_batch, batch) in follows)  # the plan's, in every bucket
    assert len({batch for _, _, (_, batch) in follows}) >= 1 and all(b > 0 for _, _, (b, _) in follows)


@pytest.mark.parametrize("update", ["gradient", "delta"])
def test_topk_encoded_by_torch_on_the_buckets_device_gives_the_host_codecs_parameters(update):
    # The device path of a CUDA bucket (the update built with torch, top-k and
    # error feedback encoded with torch into compress/topk's payload,
    # ps::worker::commit_encoded), forced on the CPU: one worker, so the
    # servers' order is fixed, and the parameters are the host codec's bit for bit.
    policy = ashl.Policy("ashl", profile_iterations=2, h_ahl=2, h_shl=2, compression_ratio=0.25, planner="uniform")
    (host, _), (dev, _) = same_schedule(
        lambda on_step: run(policy, 1, 12, update=update, compression="topk", on_step=on_step),
        lambda on_step: run(policy, 1, 12, update=update, compression="topk", device_encode=True, on_step=on_step))
    (p_host, o_host, t_host), (p_dev, o_dev, t_dev) = host[0], dev[0]
    assert all(ex.device is not None for ex in o_dev._ex) and all(ex.device is None for ex in o_host._ex)
    assert o_dev.plan.stage == "ahl" and o_dev.plan.compression_ratio == pytest.approx(0.25)
    for b, hb in zip(t_dev["buckets"], t_host["buckets"]):
        assert b["commits"] == hb["commits"]
        assert b["compress_seconds"] == 0 and hb["compress_seconds"] > 0  # ps::worker encoded nothing
    assert torch.equal(p_host, p_dev)  # bit for bit
    assert not torch.equal(p_dev, flat(mlp()))


def test_block_codec_names_and_options_reach_the_plan():
    """compression="block4:128": the servers send the block codec with
    4 bits and B = 128 in each compressing plan (plan fields codec_bits,
    codec_block), and every bucket encodes with it (docs/codecs.md "block")."""
    assert ashl._ashl.codec_name("block4") == "block4:64"
    assert ashl._ashl.codec_name("block") == "block4:64"
    assert ashl._ashl.codec_name("block2:32") == "block2:32"
    assert ashl._ashl.codec_name("topk") == "topk"
    with pytest.raises(Exception, match=r"compression.bits = 3"):
        ashl._ashl.codec_name("block3")
    with pytest.raises(Exception, match=r"compression.block = 12"):
        ashl._ashl.codec_name("block4:12")
    policy = ashl.Policy("ashl", profile_iterations=2, h_ahl=2, h_shl=2, compression_ratio=0.25, planner="uniform")
    out, _ = run(policy, 1, 12, update="delta", compression="block4:128", until_stage="ahl", then=6)
    for r, (params, opt, tel) in out.items():
        assert opt.plan.stage == "ahl"
        assert opt.plan.codec_bits == 4 and opt.plan.codec_block == 128
        for ex, b in zip(opt._ex, tel["buckets"]):
            assert ex.worker.codec == "block4:128"
            assert b["compress_seconds"] > 0
        assert torch.isfinite(params).all() and not torch.equal(params, flat(mlp()))
