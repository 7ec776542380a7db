"""ashl.torch with CUDA tensors (docs/torch.md "CUDA tensors (Python)"): the buckets live on the
device, the worker pulls into a pinned float32 host copy and commits from
another (ashl.torch.Bucket's staging). Marked gpu: skipped without a CUDA
device (bench/gpu/run.sh runs `python3 -m pytest -m gpu test/python`)."""
import pytest
import torch

import ashl
import ashl.torch as at

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (torch.cuda.is_available())")]
KIB = 1.0 / 1024


def mlp(seed, device, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 4)).to(device=device, dtype=dtype)


def train(device, dtype, steps=20, cap=4 * KIB, update="gradient", policy="bsp", compression="none",
          device_encode=None, telemetry=None):
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", server_addresses=("server0",), insecure=True)
    wjob = ashl.Job(role="worker", server_addresses=("server0",), insecure=True)
    model = mlp(3, device, dtype)
    srv = at.serve(model, sjob, policy, compression, optimizer="sgd" if update == "gradient" else "model_delta",
                   lr=0.05, fabric=fabric, background=True, bucket_cap_mb=cap)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, policy, compression,
                                  update=update, job=wjob, fabric=fabric, bucket_cap_mb=cap,
                                  device_encode=device_encode)
    g = torch.Generator().manual_seed(9)
    x = torch.randn(128, 16, generator=g)
    y = x @ torch.randn(16, 4, generator=g)
    x, y = x.to(device, dtype), y.to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(x).float() - y).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    opt.wait()
    if telemetry is not None:
        telemetry.append((opt.telemetry, [ex.device is not None for ex in opt._ex]))
    buckets = opt.buckets
    out = [p.detach().float().cpu() for p in model.parameters()]
    devices = {p.device.type for p in model.parameters()}
    opt.leave()
    srv.join()
    return losses, out, buckets, devices


def test_a_cuda_model_trains_through_pinned_staging_like_the_cpu_model():
    losses, params, buckets, devices = train("cuda", torch.float32)
    assert devices == {"cuda"} and len(buckets) >= 2
    for b in buckets:
        assert b.params.is_cuda and b.staged
        assert b.host_params.is_pinned() and b.send.is_pinned() and not b.host_params.is_cuda
    cpu_losses, cpu_params, _, _ = train("cpu", torch.float32)
    assert losses[-1] < 0.5 * losses[0]
    for a, c in zip(params, cpu_params):  # the same SGD; the device's sums round differently
        assert torch.allclose(a, c, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("update", ["gradient", "delta"])
def test_a_bf16_cuda_model_trains(update):
    losses, _, buckets, devices = train("cuda", torch.bfloat16, update=update)
    assert devices == {"cuda"} and all(b.dtype == torch.bfloat16 for b in buckets)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("update", ["gradient", "delta"])
def test_a_grad_scaler_loop_commits_only_the_finite_steps(update):
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", server_addresses=("server0",), insecure=True)
    wjob = ashl.Job(role="worker", server_addresses=("server0",), insecure=True)
    model = mlp(3, "cuda")
    srv = at.serve(model, sjob, "bsp", "none", optimizer="sgd" if update == "gradient" else "model_delta", lr=0.05,
                   fabric=fabric, background=True, bucket_cap_mb=4 * KIB)
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), model, "bsp", "none", update=update,
                                  job=wjob, fabric=fabric, bucket_cap_mb=4 * KIB, commit_in_backward=False)
    # A scale far too large: the first steps overflow in float16 and
    # scaler.step() does not call opt.step(); the scale halves each time.
    scaler = (torch.amp.GradScaler("cuda", init_scale=2.0 ** 40) if hasattr(torch, "amp") and
              hasattr(torch.amp, "GradScaler") else torch.cuda.amp.GradScaler(init_scale=2.0 ** 40))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(128, 16, generator=g)
    y = x @ torch.randn(16, 4, generator=g)
    x, y = x.cuda(), y.cuda()
    losses, skipped, steps = [], 0, 40
    for _ in range(steps):
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = (model(x).float() - y).pow(2).mean()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < scale
        losses.append(loss.item())
    opt.wait()
    assert skipped >= 5  # 2^40 down to float16's range
    assert opt.iterations == steps - skipped
    assert opt.telemetry["bucket_commits"] == opt.iterations * len(opt.buckets)
    assert losses[-1] < 0.5 * losses[skipped], losses
    opt.leave()
    srv.join()


TOPK = ashl.Policy("ashl", profile_iterations=2, h_ahl=2, h_shl=2, compression_ratio=0.25, planner="uniform")


@pytest.mark.parametrize("update", ["gradient", "delta"])
def test_topk_is_encoded_on_the_device_and_trains_like_the_host_codec(update):
    # A CUDA bucket under a top-k plan: the update is built and encoded on the
    # device (ps::worker encodes nothing: compress_seconds 0) and only the
    # payloads cross to the host; against the host codec on the pinned copy.
    dev_tel, host_tel = [], []
    losses, params, buckets, _ = train("cuda", torch.float32, update=update, policy=TOPK, compression="topk",
                                       telemetry=dev_tel)
    h_losses, h_params, _, _ = train("cuda", torch.float32, update=update, policy=TOPK, compression="topk",
                                     device_encode=False, telemetry=host_tel)
    (tel, on_device), (htel, h_on_device) = dev_tel[0], host_tel[0]
    assert len(buckets) >= 2 and all(on_device) and not any(h_on_device)
    for b, hb in zip(tel["buckets"], htel["buckets"]):
        assert b["commits"] >= 5 and abs(b["commits"] - hb["commits"]) <= 1  # AHL adopted a cycle apart at most
        assert b["compress_seconds"] == 0 and hb["compress_seconds"] > 0
        # the same payload sizes (k = round(0.25 n) per shard); measurements may differ by a message
        assert abs(b["bytes_out"] - hb["bytes_out"]) < 0.1 * hb["bytes_out"]
    assert losses[-1] < 0.7 * losses[0]
    for a, c in zip(params, h_params):  # the same codec; the device's sums may round differently
        assert torch.allclose(a, c, rtol=1e-3, atol=1e-4)
