"""bench/ps_rpc_baseline.py, the PyTorch RPC parameter server ashl is
measured against (docs/perf/ps-ucx.md, "Against PyTorch RPC"): its server
must really add every push into its parameters and send them back, or the
baseline times something that does less than ashl's commit cycle.

Both processes are real (the bench's server role, and a worker started
here), on 127.0.0.1, over the two lanes the bench compares (TensorPipe
shm + cma, uv + basic). Skips when this interpreter's torch has no
torch.distributed.rpc."""
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
try:
    from torch.distributed import rpc as _rpc
    _rpc_ok = _rpc.is_available()
except ImportError:
    _rpc_ok = False
if not _rpc_ok:
    pytest.skip("this torch has no torch.distributed.rpc (built without distributed)", allow_module_level=True)

BENCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
sys.path.insert(0, BENCH)
import ps_rpc_baseline as rpc_bench  # noqa: E402

N, PUSHES, SEED = 1000, 5, 7

# The worker: N float32 parameters reset to zeros, PUSHES seeded random
# tensors pushed, the parameters pulled back and printed.
WORKER = f"""
import json, sys, torch
sys.path.insert(0, {BENCH!r})
import ps_rpc_baseline as m
from torch.distributed import rpc
t, c = m.lane_of(sys.argv[2])
rpc.init_rpc("worker", rank=1, world_size=2, rpc_backend_options=m.backend_options(int(sys.argv[1]), t, c, 60.0))
try:
    gen = torch.Generator().manual_seed({SEED})
    rpc.rpc_sync("server", m._reset, args=({N},))
    for _ in range({PUSHES}):
        rpc.rpc_sync("server", m._push, args=(torch.randn({N}, generator=gen),))
    p = rpc.rpc_sync("server", m._pull)
finally:
    rpc.shutdown()
print(json.dumps([p.dtype == torch.float32, p.tolist()]))
"""


@pytest.mark.parametrize("lane", ["shm", "tcp"])
def test_server_parameters_are_the_sum_of_the_pushes(lane):
    port = rpc_bench.free_port()
    server = rpc_bench.start_server(port, lane, stderr=subprocess.DEVNULL)
    try:
        w = subprocess.run([sys.executable, "-c", WORKER, str(port), lane], env=rpc_bench.rpc_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        assert w.returncode == 0, w.stderr[-2000:]
        assert server.wait(timeout=60) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    is_f32, got = json.loads(w.stdout.strip().splitlines()[-1])
    assert is_f32
    gen = torch.Generator().manual_seed(SEED)
    want = torch.zeros(N, dtype=torch.float32)
    for _ in range(PUSHES):
        want.add_(torch.randn(N, generator=gen))  # the server's order of additions
    assert torch.equal(torch.tensor(got, dtype=torch.float32), want)
    assert not torch.equal(want, torch.zeros(N))  # the pushes were not all zeros
