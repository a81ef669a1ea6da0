"""The top-k check the vLLM tests share (indexer_support.assert_matches_vllm),
at exact and at fast tolerance: it must pass a valid selection, a near-tie
swap only within the fast tolerance, and never a wrong one."""

from __future__ import annotations

import indexer_support as s
import pytest
import torch
from b12x.attention.dsa_indexer import reference


def one_row(visible: int = 600, topk: int = 4):
    logits = torch.arange(visible, dtype=torch.float32).flip(0)[None] / visible  # 1 > ... > 0
    out = torch.full((1, topk), -1, dtype=torch.int32)
    out[0] = torch.arange(topk, dtype=torch.int32)  # the topk largest
    return logits, out, [(0, visible)]


def test_the_exact_check_takes_the_top_k_in_any_order_and_nothing_else():
    logits, out, rows = one_row()
    s.assert_matches_vllm(out.flip(1), logits, rows, topk=4)
    wrong = out.clone()
    wrong[0, -1] = 4  # the fifth largest instead of the fourth
    with pytest.raises(AssertionError):
        s.assert_matches_vllm(wrong, logits, rows, topk=4)


def test_the_fast_check_lets_a_near_tie_swap_within_its_tolerance_only():
    logits, out, rows = one_row()
    swapped = out.clone()
    swapped[0, -1] = 4  # 1/600 below the fourth largest
    step = 1.0 / 600
    # the check allows twice FAST_TOLERANCE x magnitude: 2 steps here, a quarter step below
    within = torch.full_like(logits, step / s.FAST_TOLERANCE)
    s.assert_matches_vllm(swapped, logits, rows, topk=4, magnitude=within)
    tight = torch.full_like(logits, step / (8 * s.FAST_TOLERANCE))
    with pytest.raises(AssertionError):
        s.assert_matches_vllm(swapped, logits, rows, topk=4, magnitude=tight)
    far = out.clone()
    far[0, -1] = 300  # half the row down: no tolerance of this size admits it
    with pytest.raises(AssertionError):
        s.assert_matches_vllm(far, logits, rows, topk=4, magnitude=within)


def packed(k: torch.Tensor) -> torch.Tensor:
    """``[pages * 64, 128]`` float K as vLLM's ``[blocks, 64, 132]`` index cache,
    per-token scales 0.5 .. 1."""
    pages = k.shape[0] // s.PAGE
    scales = torch.linspace(0.5, 1.0, pages * s.PAGE).reshape(pages, s.PAGE)
    k_fp8 = k.to(torch.float8_e4m3fn).reshape(pages, s.PAGE, 128)
    return reference.pack_index_k_cache(k_fp8, scales).reshape(pages, s.PAGE, 132)


def test_logit_magnitude_bounds_the_logits_and_is_them_without_negative_terms():
    torch.manual_seed(7)
    pages, heads = 3, 4
    k = torch.randn(pages * s.PAGE, 128)
    table = torch.tensor([[2, 0, 1]], dtype=torch.int32)
    q = torch.randn(1, heads, 128).to(torch.float8_e4m3fn)
    w = torch.rand(1, heads)
    rows = [(0, 3 * s.PAGE)]
    logits = s.vllm_logits(q, w, packed(k), table, rows)
    mag = s.logit_magnitude(q, w, packed(k), table, rows)
    assert mag.shape == logits.shape
    assert bool((logits.abs() <= mag * (1 + 1e-5) + 1e-6).all())
    assert bool((mag > logits.abs() * (1 + 1e-3)).any())  # some terms are negative here
    # with every dot product positive (q and k >= 0) and w >= 0 no term is
    # dropped or negative: the magnitude is the logit
    q_pos = q.float().abs().to(torch.float8_e4m3fn)
    logits_pos = s.vllm_logits(q_pos, w, packed(k.abs()), table, rows)
    mag_pos = s.logit_magnitude(q_pos, w, packed(k.abs()), table, rows)
    torch.testing.assert_close(mag_pos, logits_pos, rtol=1e-5, atol=1e-5)
