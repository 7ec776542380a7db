"""Training a small model under torchrun: ddp_train.py with DDP,
ashl_train.py the same under ashl's servers with BSP (3 changed lines),
ashl_adaptive_train.py with the ASHL policy (5 changed lines); docs/torch.md,
"From DDP to ashl", shows the diffs.

    torchrun --standalone --nproc-per-node 2 examples/torchrun/ddp_train.py --out DIR

Writes each rank's per-step training loss to DIR/loss.RANK.json and rank 0's
model to DIR/model.pt. A synthetic task, so it runs anywhere in seconds.
"""
import argparse
import json
import os

import torch
import ashl.torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--out", default=".")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(256, 20)
    y = (x[:, :5].sum(1) > 0).long()
    dataset = TensorDataset(x, y)
    net = torch.nn.Sequential(torch.nn.Linear(20, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    loss_fn = torch.nn.CrossEntropyLoss()
    model = net
    opt = ashl.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), model, start_servers=True)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    if rank == 0:
        torch.save(net.state_dict(), os.path.join(args.out, "model.pt"))
    with open(os.path.join(args.out, f"loss.{rank}.json"), "w") as f:
        json.dump(losses, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
