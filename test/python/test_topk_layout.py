"""The Python adapter's device top-k (ashl.torch's _DeviceUpdate.encode_topk,
which a CUDA bucket runs on the device) writes the very bytes of the C++
codec compress::topk for the same input: several sizes, ratios and shard
tails, with and without error feedback. Its k rule, payload layout and
header come from the native module (_ashl.topk_layout), not from Python
(docs/torch.md, "CUDA buckets")."""
import types

import numpy as np
import pytest
import torch

import ashl.torch as at
from ashl import _ashl


def distinct(n, seed):
    """n float32 values of n different magnitudes (no ties: every exact
    top-k selects the same elements), both signs."""
    g = torch.Generator().manual_seed(seed)
    mags = (torch.randperm(n, generator=g).to(torch.float32) + 1.0) / 64.0
    signs = torch.randint(0, 2, (n,), generator=g).to(torch.float32) * 2 - 1
    return mags * signs


def shards(n, parts):
    """(begin, size) of `parts` shards of n, the last one the shorter tail."""
    size = -(-n // parts)
    return [(b, min(size, n - b)) for b in range(0, n, size)]


def device_update(n, error_feedback):
    bucket = types.SimpleNamespace(size=n, device=torch.device("cpu"))
    return at._DeviceUpdate(bucket, "gradient", error_feedback)


@pytest.mark.parametrize("n", [1, 2, 6, 10, 257, 4099])
@pytest.mark.parametrize("ratio", [0.001, 0.01, 0.25, 0.5, 1.0])
@pytest.mark.parametrize("parts", [1, 3])
def test_device_topk_payload_is_the_codecs_bytes(n, ratio, parts):
    x = distinct(n, seed=n * 7 + parts)
    du = device_update(n, error_feedback=False)
    du.out.copy_(x)
    ranges = shards(n, parts)
    payloads = du.encode_topk(ratio, ranges)
    assert len(payloads) == len(ranges)
    for (begin, size), p in zip(ranges, payloads):
        want = _ashl.topk_encode(x[begin:begin + size].numpy(), ratio)
        assert bytes(p) == want, (n, ratio, begin, size)
        # The layout the module gives is the codec's: k, where indices and
        # values start, the size.
        k, header, idx_at, val_at, nbytes = _ashl.topk_layout(size, ratio)
        assert nbytes == len(want) and bytes(want[:idx_at]) == header
        assert np.frombuffer(want[:8], "<u8")[0] == size and np.frombuffer(want[8:12], "<u4")[0] == k
        assert val_at == idx_at + 4 * k and nbytes == val_at + 4 * k


def test_with_error_feedback_the_next_payload_is_the_codecs_of_update_plus_residual():
    n, ratio = 1000, 0.05
    ranges = shards(n, 2)
    du = device_update(n, error_feedback=True)
    x = distinct(n, 1)
    y = torch.randn(n, generator=torch.Generator().manual_seed(2))  # y + residual: no ties either
    du.out.copy_(x)
    first = du.encode_topk(ratio, ranges)
    # What was not sent stays owed: x without the selected elements.
    residual = x.clone()
    for (begin, size), p in zip(ranges, first):
        assert bytes(p) == _ashl.topk_encode(x[begin:begin + size].numpy(), ratio)
        k, _, idx_at, val_at, _ = _ashl.topk_layout(size, ratio)
        idx = np.frombuffer(bytes(p)[idx_at:val_at], "<u4").astype(np.int64)
        residual[begin + torch.from_numpy(idx)] = 0.0
    du.out.copy_(y)
    second = du.encode_topk(ratio, ranges)
    owed = y + residual
    for (begin, size), p in zip(ranges, second):
        assert bytes(p) == _ashl.topk_encode(owed[begin:begin + size].numpy(), ratio)


def test_topk_layout_refuses_what_the_codec_refuses():
    with pytest.raises(ValueError, match="topk.ratio"):
        _ashl.topk_layout(10, 0.0)
    with pytest.raises(ValueError, match="topk.ratio"):
        _ashl.topk_layout(10, 1.5)
    with pytest.raises(ValueError, match="topk.n"):
        _ashl.topk_layout(0, 0.5)
