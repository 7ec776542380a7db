"""The data ledger through ashl.torch (docs/elastic.md §3.6, §3.7): serve()
with dataset_size runs it on server 0, each worker's DistributedSampler
yields the positions of its leases, and each step's commit says the samples
it trained. An inproc job of 600 sample ids, 3 workers and a 4th that joins
mid-epoch, one that leaves and one that falls silent (evicted): every id is
trained exactly once in each epoch the ledger completed, one worker drawing
its batches through a DataLoader with two worker processes prefetching."""
import collections
import gc
import threading
import time

import pytest
import torch

import ashl
import ashl.torch as at
from torch_testing import in_threads

N = 600
BATCH = 10


class Ids(torch.utils.data.Dataset):
    """Sample i is its id."""

    def __len__(self):
        return N

    def __getitem__(self, i):
        return i


def model_of():
    torch.manual_seed(7)
    return torch.nn.Linear(3, 1)


def features(ids):
    ids = torch.as_tensor(ids, dtype=torch.float32)
    return torch.stack([ids / N, torch.sin(ids), torch.cos(ids)], dim=1), (ids % 5).unsqueeze(1) / 5


def worker_job(rank):
    return ashl.Job(role="worker", rank=rank, num_workers=3, max_workers=4, server_addresses=("server0",),
                    insecure=True)


def crash(opt):
    """The worker process dies: its connections close without a leave (the
    server evicts it). Its communication threads stop and its workers go."""
    opt.wait()
    opt._queue.put("stop")
    for t in opt._comm:
        t.join()
    opt._ex.clear()
    gc.collect()


def test_every_id_once_per_epoch_while_workers_join_leave_and_die():
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", num_workers=3, max_workers=4, server_addresses=("server0",), insecure=True)
    # give_back_after 0: an evicted worker's leases go back at once (a
    # worker waiting for a lease sends nothing: no eviction for silence).
    srv = at.serve(model_of(), sjob, "asp", fabric=fabric, background=True, worker_timeout=0.0,
                   dataset_size=N, shuffle_seed=11, ledger={"give_back_after": 0.0})
    records = [collections.defaultdict(list) for _ in range(4)]  # per rank: epoch -> ids trained
    steps = [0] * 4
    started = threading.Event()  # rank 0 trained a few steps: rank 3 joins

    def completed():
        return srv.telemetry["ledger"]["epochs_completed"]

    def train(opt, sampler, model, ids, rank):
        x, y = features(ids)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        epoch = sampler.last_step[1]  # the ledger's epoch of the batch this step trained
        assert sampler.last_step[0] == len(ids)
        records[rank][epoch].extend(int(i) for i in ids)
        steps[rank] += 1

    def body(rank):
        if rank == 3:
            assert started.wait(60)
        model = model_of()
        opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model, "asp",
                                      job=worker_job(rank), fabric=fabric, batch_size=BATCH, timeout=20)
        sampler = at.DistributedSampler(Ids(), batch_size=BATCH, optimizer=opt)
        if rank == 0:  # batches drawn ahead by two loader processes
            loader = torch.utils.data.DataLoader(Ids(), batch_sampler=sampler, num_workers=2,
                                                 persistent_workers=True)
        else:
            loader = sampler
        deadline = time.monotonic() + 120
        while True:  # an iteration may end early while a DataLoader's batches wait (docs/torch.md)
            for ids in loader:
                train(opt, sampler, model, ids, rank)
                if rank == 0 and steps[0] == 5:
                    started.set()
                if rank == 1 and steps[1] == 8:  # leaves mid-epoch: its unused positions go back
                    opt.leave()
                    return
                if rank == 2 and steps[2] == 12:  # dies mid-epoch: evicted, its unused positions go back
                    crash(opt)
                    return
                if completed() >= 2 or time.monotonic() > deadline:
                    break
            if completed() >= 2 or time.monotonic() > deadline:
                break
        opt.leave()

    errors = in_threads(4, body, 180)
    srv.stop()
    srv.join()
    assert not errors, errors
    ledger = srv.telemetry["ledger"]
    assert ledger["epochs_completed"] >= 2, (ledger, steps)
    assert ledger["overrun"] == 0, ledger  # every commit's samples were the positions it trained
    assert ledger["leases_returned"] >= 2, ledger  # the leaver's and the evicted worker's
    assert srv.telemetry["core"]["evictions"] >= 1, srv.telemetry["core"]
    assert steps[3] > 0  # the joiner trained
    for epoch in (0, 1):
        trained = collections.Counter()
        for r in range(4):
            trained.update(records[r][epoch])
        assert sorted(trained) == list(range(N)), f"epoch {epoch}: ids missing"
        assert max(trained.values()) == 1, f"epoch {epoch}: ids trained twice: " \
            f"{sorted(i for i, c in trained.items() if c > 1)[:10]}"


def test_a_ledger_parameter_is_checked_by_name():
    fabric = ashl.InprocFabric()
    with pytest.raises(ValueError, match=r"server\.ledger\.ahead = 65"):
        ashl.Server(size=4, fabric=fabric, listen="a", ledger={"samples": 100, "ahead": 65})
    with pytest.raises(ValueError, match=r"server\.ledger = \"?aheed\"?: is not a field"):
        ashl.Server(size=4, fabric=fabric, listen="b", ledger={"samples": 100, "aheed": 1})
    with pytest.raises(ValueError, match=r"needs dataset_size"):
        sjob = ashl.Job(role="server", num_workers=1, server_addresses=("c",), insecure=True)
        at.serve(model_of(), sjob, fabric=fabric, background=True, ledger={"ahead": 1})


def test_drop_last_passes_over_the_short_batch_and_the_ledger_stays_in_step():
    # 25 ids, batches of 10: each epoch yields two, the last 5 ids are
    # dropped; their positions go with the next commit, so the ledger's
    # cursor stays on the positions trained and each epoch completes.
    fabric = ashl.InprocFabric()
    sjob = ashl.Job(role="server", num_workers=1, server_addresses=("server0",), insecure=True)
    srv = at.serve(model_of(), sjob, "asp", fabric=fabric, background=True, dataset_size=25, shuffle_seed=3)
    wjob = ashl.Job(role="worker", rank=0, num_workers=1, server_addresses=("server0",), insecure=True)
    model = model_of()
    opt = at.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01), model, "asp", job=wjob,
                                  fabric=fabric, batch_size=BATCH, timeout=20)
    data = torch.utils.data.Subset(Ids(), range(25))
    sampler = at.DistributedSampler(data, batch_size=BATCH, optimizer=opt, drop_last=True)
    seen = []
    for _ in range(3):
        epoch = []
        for ids in sampler:
            assert len(ids) == BATCH
            x, y = features(ids)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
            epoch.extend(ids)
        seen.append(epoch)
    opt.leave()
    srv.join()
    assert [len(e) for e in seen] == [20, 20, 20]
    assert all(len(set(e)) == 20 for e in seen)
    ledger = srv.telemetry["ledger"]
    assert ledger["epochs_completed"] == 2, ledger  # the third's last 5 went with no commit after them
    assert ledger["overrun"] == 0, ledger
    # At the leave: epoch 2's 5 dropped positions and epoch 3's 25 went back;
    # had the dropped ones not been counted, the cursor would trail by 10.
    assert ledger["positions_returned"] == 5 + 25, ledger
