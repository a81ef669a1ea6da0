"""tools/gpu/exact_margin_probe.py: its bounds hold the logits, and a kept set
is every key a margin cannot rule out (checked on the CPU with the bench's
own inputs and b12x's float32 reference)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "gpu"))

import exact_margin_probe as probe  # noqa: E402
from b12x.bench import indexer as bi  # noqa: E402
from b12x.bench import indexer_peers as peers  # noqa: E402

TINY = bi.Case("tiny_decode", 2, 2048, prefill=False, topk=64)


def kept_keys(logits, margin, k):
    return int(probe.kept_mask(logits, margin, k).sum())


def test_kept_keys_is_the_top_k_at_no_margin_and_everything_at_a_huge_one():
    logits = torch.randperm(1000).double()
    zero = torch.zeros_like(logits)
    assert kept_keys(logits, zero, 10) == 10
    assert kept_keys(logits, zero + 1e6, 10) == 1000
    # margin 1 on distinct integers: the k-th best less 1 is reached by the
    # keys down to k-th - 2, two more than the k
    assert kept_keys(logits, zero + 1.0, 10) == 12


def test_kept_keys_holds_every_key_a_bounded_error_could_promote():
    g = torch.Generator().manual_seed(3)
    exact = torch.randn(4000, generator=g, dtype=torch.float64)
    margin = torch.rand(4000, generator=g, dtype=torch.float64) * 0.05
    fast = exact + (torch.rand(4000, generator=g, dtype=torch.float64) * 2 - 1) * margin
    k = 100
    kept = kept_keys(fast, margin, k)
    kept_set = set(torch.nonzero(probe.kept_mask(fast, margin, k)).flatten().tolist())
    assert len(kept_set) == kept
    assert set(torch.topk(exact, k).indices.tolist()) <= kept_set
    # and no more than needs be: each kept key could still pass the k-th
    # best of (fast - margin)
    low = torch.topk(fast - margin, k).values[-1]
    assert all(float(fast[t] + margin[t]) >= float(low) for t in kept_set)


def test_the_bounds_hold_the_reference_logits():
    inputs = bi.make_inputs(TINY, device="cpu")
    ref, lengths = peers.reference_logits(inputs, [0, 1])
    for r in (0, 1):
        a, step = probe.bounds(inputs, r, r, lengths[r])
        logit = ref[r, : lengths[r]].double().abs()
        assert bool((logit <= a.double() * (1 + 1e-5)).all())
        # a step's 32 products are each at most its two maxima's product
        assert bool((a <= 32 * step * (1 + 1e-5)).all())


def test_the_model_mode_counts_more_keys_for_wider_margins():
    res = probe.probe_case(TINY, 2, model=True)
    kept = res["kept_keys_per_row"]
    counts = [kept[f"step 2^-{e}"]["median"] for e in (10, 8, 6)]
    assert TINY.topk <= counts[0] <= counts[1] <= counts[2] <= TINY.context
    assert "max_err_over_a" not in res
