"""What every process of the CNN example shares: the data set, the model, the
emulated heterogeneity of the reference experiment, and small helpers; the
workload hooks the shared harness calls (examples/common: train_batch,
loss, inner_optimizer, eval_set, score, eval_size).

    from cnn_common import load_data, make_model, group_of, iteration_seconds, link_rate

Data: Fashion-MNIST from Debian's dataset-fashion-mnist (IDX files, gzip).
The orchestrator decodes the four files once into one raw ``.npy`` per
array under the run's folder (``prepare_data``); the ten processes of a run
map those files (``load_data``), so the pages are shared and nothing is
inflated twice.

Heterogeneity (docs/perf/real-vs-sim.md, examples/experiment_real.hpp): nine
workers in three groups g = rank // 3 with compute factor f_c = 2, 3, 4 and
link factor f_m = 4, 6, 8. At time scale K, a local iteration of batch 64 is
padded by a sleep to f_c x K x 10 ms after it began, and a transfer of b
bytes takes b / rate with rate = 814,120 / (f_m x K x 5 ms) bytes per
second (the reference MLP's dense model, 814,120 bytes, in f_m x 5 ms).
"""
import gzip
import os
import struct
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA_DIR = "/usr/share/datasets/fashion-mnist"
WORKERS = 9
COMPUTE_FACTOR = (2.0, 3.0, 4.0)
LINK_FACTOR = (4.0, 6.0, 8.0)
REFERENCE_COMPUTE_S = 0.010  # per batch-64 iteration, group factor 1
REFERENCE_COMM_S = 0.005  # per 814,120 bytes, link factor 1
REFERENCE_MODEL_BYTES = 814120.0
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training pixels / 255
BATCH = 64  # images per local iteration (the reference's)
EVAL_TEXT = "on all 10,000 test images"
PLOT_YLABEL = "test accuracy (10,000 images)"


# ------------------------------------------------------------------ data

def _read_idx(path, magic):
    try:
        with gzip.open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise SystemExit(f"{path}: cannot open; install the data set with `apt-get install dataset-fashion-mnist`")
    if len(raw) < 8 or struct.unpack(">I", raw[:4])[0] != magic:
        raise SystemExit(f"{path}: not an IDX file with magic {magic:#x}")
    n = struct.unpack(">I", raw[4:8])[0]
    if magic == 0x803:
        rows, cols = struct.unpack(">II", raw[8:16])
        if (rows, cols) != (28, 28) or len(raw) != 16 + n * 784:
            raise SystemExit(f"{path}: expected {n} images of 28 x 28")
        return np.frombuffer(raw, np.uint8, offset=16).reshape(n, 28, 28)
    if len(raw) != 8 + n:
        raise SystemExit(f"{path}: expected {n} labels")
    labels = np.frombuffer(raw, np.uint8, offset=8)
    if labels.max() > 9:
        raise SystemExit(f"{path}: a label is >= 10")
    return labels


def prepare_data(out_dir, data_dir=DATA_DIR):
    """Decode the IDX files once into out_dir/{train,test}_{x,y}.npy (uint8)."""
    os.makedirs(out_dir, exist_ok=True)
    for split, prefix in (("train", "train"), ("test", "t10k")):
        x = _read_idx(f"{data_dir}/{prefix}-images-idx3-ubyte.gz", 0x803)
        y = _read_idx(f"{data_dir}/{prefix}-labels-idx1-ubyte.gz", 0x801)
        if len(x) != len(y):
            raise SystemExit(f"{data_dir}: {prefix} has {len(x)} images and {len(y)} labels")
        for name, a in ((f"{split}_x", x), (f"{split}_y", y)):
            tmp = f"{out_dir}/{name}.tmp.npy"
            np.save(tmp, a)
            os.replace(tmp, f"{out_dir}/{name}.npy")


class Data:
    """The four arrays, mapped; batches come out as normalised float tensors."""

    def __init__(self, data_dir):
        self.train_x_u8 = np.load(f"{data_dir}/train_x.npy", mmap_mode="r")
        self.test_x_u8 = np.load(f"{data_dir}/test_x.npy", mmap_mode="r")
        self.train_y = torch.from_numpy(np.array(np.load(f"{data_dir}/train_y.npy"), dtype=np.int64))
        self.test_y = torch.from_numpy(np.array(np.load(f"{data_dir}/test_y.npy"), dtype=np.int64))

    @staticmethod
    def to_float(u8):
        x = torch.from_numpy(np.array(u8, dtype=np.float32)).unsqueeze(1)
        return x.mul_(1.0 / (255.0 * STD)).sub_(MEAN / STD)

    def train_batch(self, idx):
        idx = np.sort(idx)  # mapped pages in order
        return self.to_float(self.train_x_u8[idx]), self.train_y[torch.from_numpy(idx)]

    def test_set(self, count):
        """count test images: all of them, or a fixed random subset (the first
        2,000 of the file are easier than the whole by about a point)."""
        if count >= len(self.test_y):
            return self.to_float(self.test_x_u8), self.test_y
        idx = np.sort(np.random.default_rng(12345).permutation(len(self.test_y))[:count])
        return self.to_float(self.test_x_u8[idx]), self.test_y[torch.from_numpy(idx)]


# ------------------------------------------------------------------ model

class LeNet5(nn.Module):
    """LeNet-5 (ReLU, max pooling): 61,706 parameters, 246,824 bytes in f32."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


def make_model(seed):
    torch.manual_seed(1000 + seed)  # every process of one run starts from the same parameters
    return LeNet5()


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.no_grad()
def evaluate(model, x, y, chunk=2000):
    """(accuracy, mean cross-entropy) of model on x, y."""
    model.eval()
    correct, loss = 0, 0.0
    for i in range(0, len(x), chunk):
        out = model(x[i:i + chunk])
        loss += F.cross_entropy(out, y[i:i + chunk], reduction="sum").item()
        correct += (out.argmax(1) == y[i:i + chunk]).sum().item()
    model.train()
    return correct / len(x), loss / len(x)


# ------------------------------------------------------------------ heterogeneity

def group_of(rank, workers=WORKERS):
    """Group 0, 1, 2 by thirds of the workers (rank // 3 for nine)."""
    return min(2, rank * 3 // workers)


def iteration_seconds(rank, time_scale, batch=64, workers=WORKERS):
    """Emulated wall time of one local iteration of `batch` samples."""
    return COMPUTE_FACTOR[group_of(rank, workers)] * REFERENCE_COMPUTE_S * time_scale * batch / 64.0


def link_rate(rank, time_scale, workers=WORKERS):
    """Emulated link rate of a worker, bytes per wall second."""
    return REFERENCE_MODEL_BYTES / (LINK_FACTOR[group_of(rank, workers)] * REFERENCE_COMM_S * time_scale)


def mono():
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def sleep_until(t):
    d = t - mono()
    if d > 0:
        time.sleep(d)


def batch_indices(seed, rank, step, batch, count):
    """The samples of one local iteration: a pure function of (seed, rank, step)."""
    g = np.random.default_rng([seed, rank, step])
    return g.integers(0, count, size=batch)


def write_file(path, text):
    """Whole or not at all: written under another name, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def wait_for_start(run_dir, timeout=300.0):
    """The start instant (CLOCK_MONOTONIC), written by run.py once every process is ready."""
    deadline = mono() + timeout
    while mono() < deadline:
        try:
            with open(f"{run_dir}/start") as f:
                return float(f.read())
        except (FileNotFoundError, ValueError):
            time.sleep(0.005)
    raise SystemExit(f"{run_dir}: no start instant within {timeout:.0f} s")


# ------------------------------------------------------------------ the harness's hooks (examples/common)

def train_batch(data, seed, rank, step, batch):
    """The (images, labels) of one local iteration: a pure function of (seed, rank, step)."""
    return data.train_batch(batch_indices(seed, rank, step, batch, len(data.train_y)))


def loss(model, inputs):
    x, y = inputs
    return F.cross_entropy(model(x), y)


def inner_optimizer(params, cfg, a):
    """SGD with momentum (--momentum), the configuration's learning rate."""
    return torch.optim.SGD(params, lr=cfg["lr"], momentum=a.momentum)


def eval_set(data):
    return data.test_set(len(data.test_y))


def score(model, held_out):
    """(test accuracy, mean cross-entropy) on every test image."""
    return evaluate(model, *held_out)


def eval_size(held_out):
    return len(held_out[1])
