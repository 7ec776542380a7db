"""The language-model example's pure pieces (examples/lm, docs/lm.md): the
model's causality and shapes, the byte tokenizer's round trip, the
train/validation split rule, bits per byte, the batches as a pure function
of (seed, rank, step), and the protocol's metric direction and its refusal
of a method whose policy the module lacks (examples/common/protocol.py)."""
import math
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "lm"))
sys.path.insert(1, os.path.join(HERE, "..", "..", "examples", "common"))

import protocol as P  # noqa: E402


# ------------------------------------------------------------------ model

def test_changing_a_future_token_leaves_every_earlier_logit_unchanged():
    torch = pytest.importorskip("torch")
    import lm_common as L
    model = L.make_model(3)
    model.eval()
    g = torch.Generator().manual_seed(7)
    x = torch.randint(0, 256, (2, L.CONTEXT), generator=g)
    with torch.no_grad():
        base = model(x)
        for j in (1, L.CONTEXT // 2, L.CONTEXT - 1):
            y = x.clone()
            y[:, j] = (y[:, j] + 1 + torch.arange(2)) % 256
            out = model(y)
            assert torch.equal(out[:, :j], base[:, :j]), f"changing position {j} changed an earlier logit"
            # The changed position's own logits do change: the test can see a leak.
            assert not torch.allclose(out[:, j], base[:, j])


def test_the_model_maps_bytes_to_logits_over_256_and_refuses_a_longer_sequence():
    torch = pytest.importorskip("torch")
    import lm_common as L
    model = L.make_model(1)
    assert model(torch.zeros(3, 5, dtype=torch.int64)).shape == (3, 5, 256)
    with pytest.raises(ValueError, match="context is"):
        model(torch.zeros(1, L.CONTEXT + 1, dtype=torch.int64))
    n = sum(p.numel() for p in model.parameters())
    assert 300_000 <= n <= 2_000_000, n
    # The same seed gives the same parameters in every process; another seed others.
    a = torch.nn.utils.parameters_to_vector(L.make_model(1).parameters())
    b = torch.nn.utils.parameters_to_vector(L.make_model(1).parameters())
    c = torch.nn.utils.parameters_to_vector(L.make_model(2).parameters())
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_bits_per_byte_of_a_uniform_model_is_eight():
    torch = pytest.importorskip("torch")
    import lm_common as L

    class Uniform(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(*x.shape, 256)

    x = torch.randint(0, 256, (4, 16))
    bpb, nats = L.bits_per_byte(Uniform(), x, x)
    assert bpb == pytest.approx(8.0) and nats == pytest.approx(math.log(256))


# ------------------------------------------------------------------ tokenizer

def test_the_byte_tokenizer_round_trips_any_text():
    torch = pytest.importorskip("torch")
    import lm_common as L
    for text in ("", "def f(x):\n    return x  # ok", "naïve — ünïcode ✓ \u00e9\u4e2d", "\x00\x7f"):
        t = L.encode(text)
        assert t.dtype == torch.int64 and all(0 <= v < 256 for v in t.tolist())
        assert L.decode(t) == text
    assert L.encode("é").tolist() == [0xC3, 0xA9]  # bytes, not code points


# ------------------------------------------------------------------ split

def test_the_split_rule_is_a_pure_function_of_the_path():
    pytest.importorskip("torch")
    import lm_common as L
    paths = [f"library/m{i}.rst.txt" for i in range(2000)]
    train, valid = L.split(paths)
    assert set(train).isdisjoint(valid) and sorted(train + valid) == sorted(paths)
    assert 0.07 < len(valid) / len(paths) < 0.13  # about one in ten
    assert L.split(list(reversed(paths))) == (train[::-1], valid[::-1])  # the order given, the same sets
    # The rule, spelled out: the first 8 bytes of SHA-256(path), big-endian, modulo 10.
    import hashlib
    for p in paths[:50]:
        want = int.from_bytes(hashlib.sha256(p.encode()).digest()[:8], "big") % 10 == 0
        assert L.validation_document(p) == want


def test_the_prepared_corpus_is_deterministic_and_its_splits_disjoint(tmp_path):
    pytest.importorskip("torch")
    import lm_common as L
    if not os.path.isdir(L.DATA_DIR):
        pytest.skip(f"{L.DATA_DIR}: the corpus (Debian python3-doc) is not installed")
    a = L.prepare_data(str(tmp_path / "a"), L.DATA_DIR)
    b = L.prepare_data(str(tmp_path / "b"), L.DATA_DIR)
    assert (a["train_sha256"], a["valid_sha256"]) == (b["train_sha256"], b["valid_sha256"])
    assert a["train_bytes"] + a["valid_bytes"] >= 10_000_000  # at least 10 MB of text
    assert a["valid_documents"] > 0 and a["train_documents"] + a["valid_documents"] == a["documents"]
    train, valid = L.split(L.documents(L.DATA_DIR))
    assert set(train).isdisjoint(valid)
    # A validation document's text is not in the training bytes.
    data = L.Data(str(tmp_path / "a"))
    probe = open(os.path.join(L.DATA_DIR, max(valid, key=lambda p: os.path.getsize(os.path.join(L.DATA_DIR, p)))),
                 "rb").read()[:4096]
    assert bytes(data.train).find(probe) < 0 and bytes(data.valid).find(probe) >= 0


def test_batches_are_a_pure_function_of_seed_rank_and_step_and_predict_the_next_byte():
    torch = pytest.importorskip("torch")
    import numpy as np
    import lm_common as L
    stream = np.arange(10_000, dtype=np.int64) % 251

    class D:
        train = stream

    x1, y1 = L.train_batch(D, 1, 0, 5, 8)
    x2, y2 = L.train_batch(D, 1, 0, 5, 8)
    x3, _ = L.train_batch(D, 1, 1, 5, 8)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, x3)
    assert x1.shape == (8, L.CONTEXT) and torch.equal(x1[:, 1:], y1[:, :-1])


# ------------------------------------------------------------------ protocol

def test_bits_per_byte_reach_a_target_from_above():
    curve = [[5.0, 5.1], [10.0, 3.2], [15.0, 2.9], [20.0, 3.05]]
    assert P.first_reached(curve, 3.0, P.BITS_PER_BYTE) == 15.0
    assert P.first_reached(curve, 2.0, P.BITS_PER_BYTE) is None
    assert P.first_reached([[5.0, 0.85], [10.0, 0.9]], 0.88) == 10.0  # the CNN's accuracy: from below


def test_the_summary_picks_the_best_rival_by_time_then_by_lower_bits_per_byte():
    def row(m, seed, t, bpb):
        return {"method": m, "seed": seed, "time_to_target_s": t, "final_bpb": bpb, "measured_ms_per_iteration": 1.0,
                "emulated_ms_per_iteration": 1.0, "bytes_up_per_worker": 1.0, "bytes_down_per_worker": 1.0,
                "overrun_fraction": 0.0, "samples": 100, "tokens": 6400, "budget_s": 300.0,
                "curve": [[t or 300.0, bpb]]}
    rows = [row("ddp", 1, None, 3.4), row("ddp_localsgd", 1, None, 3.1), row("ashl", 1, 150.0, 2.9)]
    s = P.summarize(rows, 3.0, 300.0, n_boot=200, metric=P.BITS_PER_BYTE, rivals=("ddp", "ddp_localsgd"),
                    rival_name="the best rival")
    assert s["best_ddp"] == "ddp_localsgd"  # neither reached 3.0: the lower final bits per byte
    assert s["methods"]["ashl"]["samples_per_s"] == pytest.approx(6400 / 300.0)  # tokens, not sequences
    text = P.report_table(s)
    assert "final validation bits per byte" in text and "DDP post-local SGD (best rival)" in text
    assert "the best rival (DDP post-local SGD)" in text
    assert "tokens per second" in P.efficiency_table(s)
    assert "0.7x the best rival" in P.verdict_text(s)


def test_a_method_whose_policy_the_module_lacks_is_refused_by_name():
    help_text = ("  bsp         bulk synchronous rounds, mean or samples-weighted\n"
                 "              reads: workers weighting batch_size\n"
                 "  ashl        profiling, then AHL\n")
    names = P.policy_names(help_text)
    assert names == ["bsp", "ashl"]
    why = P.missing_policies(["ddp", "ashl", "diloco", "async_local_sgd"], names)
    assert "diloco (DiLoCo) needs the diloco policy" in why
    assert "async_local_sgd (Async Local-SGD, delayed Nesterov) needs the async_diloco policy" in why
    assert "bsp, ashl" in why
    assert P.missing_policies(["ddp", "ashl"], names) is None
    assert P.missing_policies(["diloco"], names + ["diloco"]) is None
    assert P.missing_policies(["async_local_sgd", "ashl_outer"], names + ["async_diloco", "ashl_diloco"]) is None
    # Streaming DiLoCo needs the diloco policy (its fragment servers'), nothing the workers lack.
    assert "streaming_diloco_4bit (Streaming DiLoCo, 4-bit) needs the diloco policy" in \
        P.missing_policies(["streaming_diloco_4bit"], names)
    assert P.missing_policies(["streaming_diloco_4bit"], names + ["diloco"]) is None
    for m in P.OUTER_METHODS:
        assert m in P.LABEL and m in P.KNOWN_METHODS and m not in P.ALL_METHODS  # the CNN's nine unchanged


def test_the_lm_grid_gives_every_method_the_same_budget():
    import json
    with open(os.path.join(HERE, "..", "..", "examples", "lm", "grid.json")) as f:
        grid = json.load(f)
    counts = {m: len(P.grid_configs(grid, m)) for m in grid["methods"]}
    assert set(counts.values()) == {4}
    for m in ("ddp", "ddp_localsgd", "adsp", "ashl", "ashl_plus") + P.OUTER_METHODS:
        assert m in grid["methods"]
    for m, knob in (P.KNOB | P.OUTER_KNOB).items():  # each knob takes two values (ashl_outer: r0)
        if m in grid["methods"]:
            assert len({c[knob] for c in grid["methods"][m]}) == 2, m


def test_a_ddp_step_of_two_buckets_pads_once_and_counts_an_overrun_only_when_its_first_bucket_is_late():
    # The language model's gradients fill two DDP buckets: the second bucket's hook comes after the
    # first one's costed all-reduce, past the pad by design, and is not an overrun.
    import ddp_worker
    now = [0.0]
    slept, calls = [], []
    state = {"until": 0.0, "overruns": 0, "first": False}
    hook = ddp_worker.padded_hook(lambda s, b: calls.append(b) or b, state, lambda: now[0], slept.append)
    for step, first_at in enumerate((0.5, 1.5, 2.2)):  # the pad of step k ends at k + 1
        state["until"], state["first"] = step + 1.0, True
        now[0] = step + first_at
        hook(None, "bucket-1")
        now[0] = step + 1.3  # after the first bucket's all-reduce
        hook(None, "bucket-2")
    assert state["overruns"] == 2  # steps 1 and 2 began their first bucket after their pad's end
    assert slept == [1.0, 2.0, 3.0] and calls == ["bucket-1", "bucket-2"] * 3
