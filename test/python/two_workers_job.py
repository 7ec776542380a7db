"""A job for test_torch.py, started by ashl.run (ashl-run -s 1 -w 2): a
linear regression whose workers each hold half the data; worker 0 writes its
first and last loss to argv[1]. ASHL_TEST_POLICY (JSON: name and
ps::policy_params fields; default BSP) chooses the policy."""
import json
import os
import sys

import torch

import ashl
import ashl.torch as at

job = ashl.job()
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
cap = float(os.environ.get("ASHL_TEST_BUCKET_MB", "25"))  # a tiny cap: weight and bias in two buckets
spec = json.loads(os.environ.get("ASHL_TEST_POLICY", '{"name": "bsp"}'))
policy = ashl.Policy(spec.pop("name"), **spec)
if job.role == "server":
    at.serve(model, job, policy, "none", bucket_cap_mb=cap)
    sys.exit(0)

g = torch.Generator().manual_seed(100 + job.rank)
truth = torch.arange(8, dtype=torch.float32).reshape(1, 8) / 8
x = torch.randn(256, 8, generator=g)
y = x @ truth.t() + 0.5
opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, policy, "none", timeout=30.0,
                              bucket_cap_mb=cap)
losses = []
for it in range(40):
    i = torch.randint(0, 256, (opt.batch_size,), generator=g)
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x[i]), y[i])
    loss.backward()
    opt.step()
    opt.report_metric("loss", loss.item())
    losses.append(loss.item())
with torch.no_grad():
    final = torch.nn.functional.mse_loss(model(x), y).item()
commits = opt.commits
buckets = len(opt.buckets)
bucket_commits = [b["commits"] for b in opt.telemetry["buckets"]]
stage = opt.plan.stage
opt.leave()
if job.rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump({"first_loss": losses[0], "last_loss": final, "iterations": len(losses), "commits": commits,
                   "buckets": buckets, "bucket_commits": bucket_commits, "stage": stage}, f)
