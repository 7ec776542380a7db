"""What the ashl.torch tests (test_torch*.py) share: the MLP they train, an
in-process job's ashl.Job values, a flat copy of a model's parameters, and
workers run in threads."""
import threading

import torch

import ashl

KIB = 1.0 / 1024  # bucket_cap_mb (or partition_mb) of one KiB


def mlp(seed=5, dtype=torch.float32):
    """Linear(16, 32) -> tanh -> Linear(32, 32) -> tanh -> Linear(32, 4), the
    same initial parameters for the same seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4)).to(dtype)


def jobs(workers=1):
    """The server's and each worker's ashl.Job of a job over an InprocFabric
    (server "server0", no token)."""
    s = ashl.Job(role="server", num_workers=workers, server_addresses=("server0",), insecure=True)
    w = [ashl.Job(role="worker", rank=r, num_workers=workers, server_addresses=("server0",), insecure=True)
         for r in range(workers)]
    return s, w


def flat(model):
    """Every parameter, one after another in registration order (a copy)."""
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


def in_threads(workers, body, timeout):
    """Runs body(r) for each rank r in a thread of its own and waits for them
    (each at most `timeout` seconds); returns what they raised."""
    errors = []

    def run(r):
        try:
            body(r)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    return errors
