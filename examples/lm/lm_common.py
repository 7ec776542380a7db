"""What every process of the language-model example shares: the corpus and
its split, the byte tokenizer, the model (a small GPT), the emulated
heterogeneity, and the hooks the shared harness calls (examples/common:
train_batch, loss, inner_optimizer, eval_set, score, eval_size).
docs/lm.md.

    from lm_common import prepare_data, Data, make_model, train_batch, score

Corpus: the reStructuredText sources of Python's documentation that
Debian's python3-doc installs (python3.11-doc on Debian 12:
/usr/share/doc/python3.11/html/_sources/**/*.txt, 497 files, 11.1 MB of
English prose and examples; PSF licence). Nothing is downloaded.

Split (a rule, not a list): a document (one source file) is validation when
the first 8 bytes of the SHA-256 of its path relative to the sources
folder, as a big-endian integer, are 0 modulo 10 (validation_document);
the rest is training. Each split is its documents, sorted by path, joined
with one blank line; prepare_data writes them once into the run's folder
(train.bin, valid.bin, uint8) with a manifest (files, bytes, SHA-256).

Tokens are bytes (vocabulary 256): encode is str -> UTF-8 bytes, decode the
inverse; every byte the corpus holds is a token, so nothing is unknown.

Evaluation: bits per byte of the model on a fixed held-out slice: EVAL_SEQS
windows of CONTEXT + 1 bytes of valid.bin at offsets drawn once from a
fixed seed (eval_offsets), the cross-entropy of every predicted byte over
ln 2.

Heterogeneity: the CNN's three speed groups and link model (cnn_common:
group g = rank // 3 of nine, compute factor 2, 3, 4, link factor 4, 6, 8,
the same link rates); a local iteration of BATCH sequences is padded to
f_c x K x REFERENCE_COMPUTE_S from its start. REFERENCE_COMPUTE_S is set
from the measured step time so that nine workers fit on two cores
(docs/lm.md, "Size").
"""
import glob
import hashlib
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "cnn"))

# The emulation's constants and process helpers are the CNN's: one model of speed groups and links.
from cnn_common import (COMPUTE_FACTOR, LINK_FACTOR, REFERENCE_COMM_S, REFERENCE_MODEL_BYTES, WORKERS,  # noqa: E402,F401
                        group_of, link_rate, mono, sleep_until, wait_for_start, write_file)


def _default_data_dir():
    found = sorted(glob.glob("/usr/share/doc/python3.*/html/_sources"))
    return found[-1] if found else "/usr/share/doc/python3.11/html/_sources"


DATA_DIR = _default_data_dir()
VOCAB = 256
CONTEXT = 64  # bytes a sequence predicts from (docs/lm.md, "Size")
D_MODEL, LAYERS, HEADS = 128, 2, 4
BATCH = 8  # sequences per local iteration: 512 predicted bytes
# Reference seconds of one local iteration of BATCH sequences at compute factor 1 (x K wall seconds):
# the CNN's 10 ms would pad below the measured step, about 90 ms on a loaded core; with 60 ms the
# nine workers' pads (0.6, 0.9, 1.2 s at K = 5) leave them 3.25 x 90 / 300 = 1 core (docs/lm.md, "Size").
REFERENCE_COMPUTE_S = 0.060
VALID_MODULUS = 10  # one document in ten is validation
EVAL_SEQS = 64
EVAL_SEED = 12345
EVAL_TEXT = f"on {EVAL_SEQS} x {CONTEXT} held-out bytes"
PLOT_YLABEL = f"validation bits per byte ({EVAL_SEQS} x {CONTEXT} bytes)"


def child_env():
    """The environment of a run's processes: Debian's torch 1.13 is built
    against the generic libblas.so.3, and the reference BLAS makes a step of
    this model about 10x slower than OpenBLAS (docs/lm.md, "Size");
    libopenblas0-serial (scripts/deps.sh) is loaded first when it is there."""
    d = "/usr/lib/x86_64-linux-gnu/openblas-serial"
    if not os.path.exists(os.path.join(d, "libblas.so.3")):
        return {}
    old = os.environ.get("LD_LIBRARY_PATH", "")
    return {"LD_LIBRARY_PATH": d + (os.pathsep + old if old else "")}


# ------------------------------------------------------------------ tokenizer

def encode(text):
    """Byte-level tokens: the UTF-8 bytes of text, as int64."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.int64)


def decode(tokens):
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


# ------------------------------------------------------------------ data

def validation_document(rel_path, modulus=VALID_MODULUS):
    """The split rule: True when the document at rel_path (relative to the
    sources folder, '/'-separated) is held out for validation."""
    h = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(h[:8], "big") % modulus == 0


def documents(data_dir=DATA_DIR):
    """The corpus's documents: their relative paths, sorted."""
    if not os.path.isdir(data_dir):
        raise SystemExit(f"{data_dir}: no such folder; install Python's documentation with "
                         "`apt-get install python3-doc` (scripts/deps.sh)")
    out = []
    for root, _, files in os.walk(data_dir):
        for f in files:
            if f.endswith(".txt"):
                out.append(os.path.relpath(os.path.join(root, f), data_dir).replace(os.sep, "/"))
    if not out:
        raise SystemExit(f"{data_dir}: no .txt documents")
    return sorted(out)


def split(paths):
    """(training paths, validation paths) by validation_document."""
    valid = [p for p in paths if validation_document(p)]
    train = [p for p in paths if not validation_document(p)]
    return train, valid


def _join(data_dir, paths):
    return b"\n\n".join(open(os.path.join(data_dir, p), "rb").read() for p in paths)


def prepare_data(out_dir, data_dir=DATA_DIR):
    """Write out_dir/train.bin and valid.bin (the two splits' bytes) and
    manifest.json once; a second call with the same corpus leaves them."""
    os.makedirs(out_dir, exist_ok=True)
    paths = documents(data_dir)
    train, valid = split(paths)
    manifest = {"data_dir": data_dir, "documents": len(paths), "train_documents": len(train),
                "valid_documents": len(valid), "rule": f"sha256(path)[:8] % {VALID_MODULUS} == 0 is validation"}
    man_path = os.path.join(out_dir, "manifest.json")
    if os.path.exists(man_path) and all(os.path.exists(os.path.join(out_dir, f)) for f in ("train.bin", "valid.bin")):
        with open(man_path) as f:
            old = json.load(f)
        if all(old.get(k) == v for k, v in manifest.items()):
            return old
    for name, ps in (("train", train), ("valid", valid)):
        blob = _join(data_dir, ps)
        tmp = os.path.join(out_dir, f"{name}.bin.tmp")
        with open(tmp, "wb") as f:
            f.write(blob)
        os.replace(tmp, os.path.join(out_dir, f"{name}.bin"))
        manifest[f"{name}_bytes"] = len(blob)
        manifest[f"{name}_sha256"] = hashlib.sha256(blob).hexdigest()
    write_file(man_path, json.dumps(manifest, indent=1) + "\n")
    return manifest


class Data:
    """The two splits, mapped (shared pages among the processes of a run)."""

    def __init__(self, data_dir):
        self.train = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint8, mode="r")
        self.valid = np.memmap(os.path.join(data_dir, "valid.bin"), dtype=np.uint8, mode="r")


def windows(stream, offsets, context=CONTEXT):
    """(x, y): for each offset the context bytes from it and the same shifted by one."""
    idx = np.asarray(offsets, dtype=np.int64)[:, None] + np.arange(context + 1, dtype=np.int64)[None, :]
    w = torch.from_numpy(np.asarray(stream[idx], dtype=np.int64))
    return w[:, :-1], w[:, 1:]


def batch_offsets(seed, rank, step, batch, count, context=CONTEXT):
    """The sequences of one local iteration: a pure function of (seed, rank, step)."""
    g = np.random.default_rng([seed, rank, step])
    return g.integers(0, count - context - 1, size=batch)


def eval_offsets(count, seqs=EVAL_SEQS, context=CONTEXT, seed=EVAL_SEED):
    """The held-out slice: seqs window starts in the validation bytes, drawn once from a fixed seed, sorted."""
    g = np.random.default_rng(seed)
    return np.sort(g.integers(0, count - context - 1, size=seqs))


# ------------------------------------------------------------------ model

class Block(nn.Module):
    """Pre-norm: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x, mask):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // self.heads))
        att = att.masked_fill(mask[:t, :t], float("-inf")).softmax(dim=-1)  # causal: no position sees a later one
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class GPT(nn.Module):
    """A decoder-only transformer over bytes: token and learned position
    embeddings, pre-norm blocks of causal self-attention and a GELU MLP, a
    final LayerNorm, the output layer tied to the token embedding."""

    def __init__(self, d=D_MODEL, layers=LAYERS, heads=HEADS, context=CONTEXT, vocab=VOCAB):
        super().__init__()
        if d % heads:
            raise ValueError(f"d = {d}: must be a multiple of heads = {heads}")
        self.context = context
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        # A plain attribute, not a buffer: the same in every process, never sent (DDP broadcasts
        # buffers at construction, and gloo has no bool type).
        self.mask = torch.ones(context, context, dtype=torch.bool).triu(1)
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() >= 2:
                # GPT-2's: 0.02, and the residual projections scaled by 1 / sqrt(2 layers).
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, x):
        t = x.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens: the context is {self.context}")
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        for blk in self.blocks:
            h = blk(h, self.mask)
        return self.norm(h) @ self.tok.weight.t()


def make_model(seed):
    torch.manual_seed(1000 + seed)  # every process of one run starts from the same parameters
    return GPT()


def model_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


@torch.no_grad()
def bits_per_byte(model, x, y, chunk=32):
    """(bits per byte, mean cross-entropy in nats) of model on the windows x, y."""
    model.eval()
    nats, n = 0.0, 0
    for i in range(0, len(x), chunk):
        logits = model(x[i:i + chunk])
        nats += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[i:i + chunk].reshape(-1),
                                reduction="sum").item()
        n += y[i:i + chunk].numel()
    model.train()
    return nats / n / math.log(2.0), nats / n


# ------------------------------------------------------------------ heterogeneity

def iteration_seconds(rank, time_scale, batch=BATCH, workers=WORKERS):
    """Emulated wall time of one local iteration of `batch` sequences."""
    return COMPUTE_FACTOR[group_of(rank, workers)] * REFERENCE_COMPUTE_S * time_scale * batch / BATCH


# ------------------------------------------------------------------ the harness's hooks (examples/common)

def train_batch(data, seed, rank, step, batch):
    return windows(data.train, batch_offsets(seed, rank, step, batch, len(data.train)))


def loss(model, inputs):
    x, y = inputs
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def inner_optimizer(params, cfg, a):
    """AdamW for every method (betas 0.9, 0.95; the configuration's learning rate and weight decay)."""
    return torch.optim.AdamW(params, lr=cfg["lr"], betas=(0.9, 0.95), weight_decay=cfg.get("weight_decay", 0.1))


def eval_set(data):
    return windows(data.valid, eval_offsets(len(data.valid)))


def score(model, held_out):
    return bits_per_byte(model, *held_out)


def eval_size(held_out):
    return int(held_out[1].numel())
