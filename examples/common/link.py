"""The emulated links of the CNN comparison: one model of time for every
method's bytes.

    link = Link(rate, server=ServerPort.open(path, server_rate))  # an ashl worker
    link.hold("up", commit_bytes)       # ps::worker calls this before it sends (worker_params::link_hold)
    link.hold("down", reply_bytes)      # ... and after a pull reply arrived
    costed_all_reduce(link)             # a DDP rank: every dist.all_reduce pays its ring bytes first

The model, the same for all methods:

- Every node (worker, and the ashl server) has a full-duplex link: an up
  channel and a down channel, each carrying `rate` bytes per second, each a
  FIFO (a transfer starts when the channel's previous one ended). Bytes are
  the real bytes of the message: for ashl the commit's and the reply's
  headers and payloads as ps::worker encodes them; for DDP the tensor that
  dist.all_reduce is given (fp32, fp16, PowerSGD's P and Q factors, the
  uncompressed biases, post-local SGD's flattened parameters).
- A ring all-reduce of b bytes among n ranks sends 2 (n - 1) / n x b on
  each rank's up channel and receives as many on its down channel at the
  same time; the call is held until both channels carried them, and gloo's
  all-reduce then waits for the slowest rank, as a ring waits for its
  slowest link.
- An ashl commit of b bytes crosses the worker's up channel and the
  server's down channel; a pull reply crosses the server's up channel and
  the worker's down channel. The server's channels are shared by all its
  workers (ServerPort: two FIFO clocks in a small shared file, taken under
  a lock), so nine workers' commits queue at the server as they would at a
  tenth node's link. A transfer ends when the later of its two channels has
  carried it (cut-through: the server's port is busy b / server_rate of it).
  A commit and its reply are serial because the reply answers the commit,
  not because the link is costed half-duplex.

Everything is a sleep on CLOCK_MONOTONIC (system wide, so the processes'
reservations compare), never a spin: ten processes share two cores.
"""
import fcntl
import mmap
import os
import struct
import threading
import time

DIRECTIONS = ("up", "down")


def mono():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def ring_bytes(tensor_bytes, n):
    """Bytes a ring all-reduce of tensor_bytes puts on each rank's up (and down) channel."""
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * tensor_bytes


class Channel:
    """One direction of a link: a FIFO at `rate` bytes per second."""

    def __init__(self, rate):
        if not rate > 0:
            raise ValueError(f"rate = {rate}: must be > 0 bytes per second")
        self.rate = float(rate)
        self.free_at = 0.0

    def reserve(self, nbytes, now):
        """Carry nbytes from `now` (or when the channel is free): the end instant."""
        start = max(now, self.free_at)
        self.free_at = start + nbytes / self.rate
        return self.free_at


class ServerPort:
    """The server's two channels, shared by every worker process of a run:
    two doubles (the instants its up and down channels are free) in a
    16-byte file, read and written under an exclusive flock."""

    def __init__(self, path, rate):
        if not rate > 0:
            raise ValueError(f"server rate = {rate}: must be > 0 bytes per second")
        self.rate = float(rate)
        self.path = path
        self._fd = os.open(path, os.O_RDWR)
        self._map = mmap.mmap(self._fd, 16)

    @staticmethod
    def create(path, rate):
        with open(path, "wb") as f:
            f.write(struct.pack("<dd", 0.0, 0.0))
        return ServerPort(path, rate)

    def reserve(self, direction, nbytes, now):
        """The server's `direction` channel ("up": server to workers) carries
        nbytes from now or when it is free: the end instant."""
        i = DIRECTIONS.index(direction)
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            free = struct.unpack_from("<d", self._map, 8 * i)[0]
            end = max(now, free) + nbytes / self.rate
            struct.pack_into("<d", self._map, 8 * i, end)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return end

    def close(self):
        self._map.close()
        os.close(self._fd)


class Link:
    """A node's full-duplex link (and, for an ashl worker, the server's port
    its transfers also cross). Counts the bytes and the seconds it held."""

    def __init__(self, rate, server=None, clock=mono, sleep=time.sleep):
        self.up = Channel(rate)
        self.down = Channel(rate)
        self.server = server
        self.bytes = {"up": 0, "down": 0}
        self.seconds = 0.0
        self.transfers = 0
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()  # DDP's hooks may call from gloo's callback thread

    def _channel(self, direction):
        return self.up if direction == "up" else self.down

    def end_of(self, direction, nbytes, now):
        """Reserve one transfer of nbytes in `direction` ("up": from this
        node); the instant it ends. A worker's up is the server's down."""
        if direction not in DIRECTIONS:
            raise ValueError(f"direction = {direction!r}: must be 'up' or 'down'")
        end = self._channel(direction).reserve(nbytes, now)
        if self.server is not None:
            end = max(end, self.server.reserve("down" if direction == "up" else "up", nbytes, now))
        return end

    def hold(self, direction, nbytes):
        """Hold the calling thread while nbytes cross the link (ps::worker's link_hold)."""
        nbytes = int(nbytes)
        with self._lock:
            now = self._clock()
            end = self.end_of(direction, nbytes, now)
            self.bytes[direction] += nbytes
            self.transfers += 1
        self._wait(now, end)

    def hold_duplex(self, up_bytes, down_bytes):
        """Both directions at once (a ring's step): held until both carried theirs."""
        with self._lock:
            now = self._clock()
            end = max(self.end_of("up", up_bytes, now), self.end_of("down", down_bytes, now))
            self.bytes["up"] += int(up_bytes)
            self.bytes["down"] += int(down_bytes)
            self.transfers += 1
        self._wait(now, end)

    def _wait(self, now, end):
        d = end - now
        if d > 0:
            self._sleep(max(0.0, end - self._clock()))
            with self._lock:
                self.seconds += d

    def stats(self):
        return {"bytes_up": self.bytes["up"], "bytes_down": self.bytes["down"], "link_seconds": self.seconds,
                "transfers": self.transfers}


def costed_all_reduce(link, dist=None, size_of=None):
    """Make every torch.distributed.all_reduce of this process pay its ring
    bytes on `link` before it runs (the DDP hooks, PowerSGD's P and Q
    all-reduces and post-local SGD's averaging all call
    torch.distributed.all_reduce by attribute). size_of(group): the ranks
    of the ring (default: the group's size). Returns the original."""
    if dist is None:
        import torch.distributed as dist
    if size_of is None:
        size_of = lambda group: dist.get_world_size(group) if group is not None else dist.get_world_size()
    original = dist.all_reduce
    if getattr(original, "_cnn_costed", False):
        raise RuntimeError("torch.distributed.all_reduce is already costed")

    def all_reduce(tensor, op=None, group=None, async_op=False):
        b = ring_bytes(tensor.numel() * tensor.element_size(), size_of(group))
        if b > 0:
            link.hold_duplex(b, b)
        if op is None:
            return original(tensor, group=group, async_op=async_op)
        return original(tensor, op=op, group=group, async_op=async_op)

    all_reduce._cnn_costed = True
    all_reduce.original = original
    dist.all_reduce = all_reduce
    return original
