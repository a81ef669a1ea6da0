"""dsa_indexer.reference against brute-force loops, and the tie-aware comparison helper."""

from __future__ import annotations

import math
import struct

import b12x
import pytest
import torch
from b12x.attention.dsa_indexer import reference as ref
from dsa_indexer_cases import make_inputs

TOPK = 512
INF = math.inf


# --- brute force: one page, one row at a time, bytes decoded by hand ------------------------


def brute_logits(inputs) -> list[dict[int, float]]:
    """{position: logit} of every candidate of every row."""
    q, w = inputs["q_fp8"].float(), inputs["query_weights"]
    cache, table = inputs["index_k_cache"], inputs["page_table"]
    rows, heads, _ = q.shape
    w = w.reshape(rows, heads)
    width = table.shape[1]
    aw = int(inputs["active_width"][0])
    out = []
    for r in range(rows):
        limit = max(0, min(int(inputs["cache_lengths"][r]), aw, width * 64))
        row = {}
        for col in range(-(-limit // 64)):
            pid = int(table[r, col])
            if pid < 0 or pid >= cache.shape[0]:  # unmapped, or past the cache
                continue
            page = cache[pid]
            k = page[:8192].clone().view(torch.float8_e4m3fn).float().view(64, 128)
            scales = struct.unpack("<64f", bytes(page[8192:8448].tolist()))
            dots = (k[:, None, :] * q[r][None]).sum(-1)  # [64 slots, heads], no BLAS
            head_sums = (torch.relu(dots) * w[r]).sum(dim=1).tolist()
            for slot in range(min(64, limit - col * 64)):
                row[col * 64 + slot] = scales[slot] * head_sums[slot]
        out.append(row)
    return out


def order(item: tuple[int, float]) -> tuple[bool, float, int]:
    t, v = item
    return (math.isnan(v), 0.0 if math.isnan(v) else -v, t)


def brute_select(values: dict[int, float], topk: int) -> tuple[list[int], list[float]]:
    chosen = sorted(values.items(), key=order)[:topk]
    pad = topk - len(chosen)
    return [t for t, _ in chosen] + [-1] * pad, [v for _, v in chosen] + [-INF] * pad


def assert_same_floats(a: list[float], b: list[float]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert (math.isnan(x) and math.isnan(y)) or x == y, (x, y)


def check_against_brute(inputs, topk=TOPK, index_space="logical"):
    logits = ref.paged_logits(**inputs)
    pages = inputs["index_k_cache"].shape[0]
    mask = ref.candidate_mask(
        inputs["page_table"], inputs["cache_lengths"], inputs["active_width"], pages=pages
    )
    brute = brute_logits(inputs)
    for r, row in enumerate(brute):
        assert set(row) == set(mask[r].nonzero().flatten().tolist())
        if row:
            ts = list(row)
            assert torch.allclose(
                logits[r, ts], torch.tensor([row[t] for t in ts]), rtol=1e-5, atol=1e-5
            )
        assert bool((logits[r, ~mask[r]] == -INF).all())
    idx, scores = ref.indexer_topk(**inputs, topk=topk, index_space=index_space)
    for r in range(len(brute)):
        # select over the reference's own logits so that the order check is exact
        values = {t: float(logits[r, t]) for t in brute[r]}
        want_idx, want_scores = brute_select(values, topk)
        if index_space == "physical":
            table = inputs["page_table"]
            want_idx = [-1 if t < 0 else int(table[r, t // 64]) * 64 + t % 64 for t in want_idx]
        assert idx[r].tolist() == want_idx
        assert_same_floats(scores[r].tolist(), want_scores)
    return idx, scores


# --- the page packer -----------------------------------------------------------------------


def test_pack_is_planar_and_unpack_inverts_it():
    k = torch.randn(3, 64, 128)
    k[1, 5] = 0  # an all-zero row gets scale 1
    k_fp8, scales = ref.quantize_index_k(k)
    assert float(scales[1, 5]) == 1.0
    amax = k.abs().amax(-1)
    assert torch.allclose(scales[0], amax[0] / 448)
    cache = ref.pack_index_k_cache(k_fp8, scales)
    assert cache.shape == (3, 8448) and cache.dtype == torch.uint8 and cache.stride() == (8448, 1)
    p, s = 2, 17
    assert bytes(cache[p, s * 128 : (s + 1) * 128].tolist()) == bytes(
        k_fp8[p, s].view(torch.uint8).tolist()
    )
    assert cache[p, 8192 + 4 * s : 8192 + 4 * s + 4].tolist() == list(
        struct.pack("<f", float(scales[p, s]))
    )
    k2, s2 = ref.unpack_index_k_cache(cache)
    assert torch.equal(k2.view(torch.uint8), k_fp8.view(torch.uint8)) and torch.equal(s2, scales)
    # e4m3 keeps 3 mantissa bits: the error is at most half a step of 32 at the top binade
    dequant = k2.float() * s2[..., None]
    assert bool(((dequant - k).abs() <= 16 * s2[..., None]).all())


def test_padded_page_stride():
    k_fp8, scales = ref.quantize_index_k(torch.randn(4, 64, 128))
    cache = ref.pack_index_k_cache(k_fp8, scales, page_stride=8448 + 64)
    assert cache.shape == (4, 8448) and cache.stride() == (8512, 1)
    full = cache.as_strided((4, 8512), (8512, 1))
    assert int(full[:, 8448:].count_nonzero()) == 0
    k2, s2 = ref.unpack_index_k_cache(cache)
    assert torch.equal(k2.view(torch.uint8), k_fp8.view(torch.uint8)) and torch.equal(s2, scales)
    with pytest.raises(b12x.ConfigError, match="pack_index_k_cache: page_stride expected >= 8448"):
        ref.pack_index_k_cache(k_fp8, scales, page_stride=8000)
    with pytest.raises(b12x.ShapeError, match=r"k_fp8 expected shape \(4, 64, 128\)"):
        ref.pack_index_k_cache(k_fp8[:, :32], scales)


# --- the whole op against brute force ------------------------------------------------------


def test_lengths_zero_short_and_long_with_partial_pages():
    # 700 rows = 10 pages + 60 (> topk), 300 = 4 pages + 44 (< topk), 0
    inputs = make_inputs(rows=3, heads=4, width=12, lengths=[700, 300, 0])
    idx, scores = check_against_brute(inputs)
    assert int((idx[0] >= 0).sum()) == 512
    assert int((idx[1] >= 0).sum()) == 300 and idx[1, 300:].eq(-1).all()
    assert idx[2].eq(-1).all() and scores[2].eq(-INF).all()


def test_unmapped_pages_are_never_selected():
    inputs = make_inputs(rows=2, heads=2, width=6, lengths=[380, 200], unmapped=((0, 2), (1, 0)))
    idx, _ = check_against_brute(inputs)
    assert not ((idx[0] >= 128) & (idx[0] < 192)).any()
    assert int((idx[1] >= 0).sum()) == 200 - 64
    assert not ((idx[1] >= 0) & (idx[1] < 64)).any()


def test_active_width_bounds_every_row():
    inputs = make_inputs(rows=2, heads=2, width=12, lengths=[700, 300], active_width=400)
    idx, _ = check_against_brute(inputs)
    assert int(idx.max()) < 400 and int((idx[0] >= 0).sum()) == 400


def test_shared_prefill_table_matches_the_materialised_one():
    inputs = make_inputs(rows=4, heads=4, width=14, lengths=[100, 200, 513, 800], mode="prefill")
    assert inputs["page_table"].stride() == (0, 1)
    shared, _ = check_against_brute(inputs)
    dense = dict(inputs, page_table=inputs["page_table"].contiguous())
    assert torch.equal(ref.indexer_topk(**dense, topk=TOPK)[0], shared)


def test_physical_index_space():
    inputs = make_inputs(rows=2, heads=2, width=10, lengths=[600, 90], unmapped=((1, 0),))
    check_against_brute(inputs, index_space="physical")


@pytest.mark.parametrize("topk", [1024, 2048])
def test_larger_topk(topk):
    check_against_brute(make_inputs(rows=2, heads=2, width=40, lengths=[2500, 1500]), topk=topk)


def test_multiple_chunks():
    # 520 pages > 512: a default plan scores this in two 32768-row chunks
    inputs = make_inputs(rows=1, heads=2, width=520, lengths=[520 * 64 - 5])
    check_against_brute(inputs)


def test_page_ids_past_the_cache_are_unmapped_and_reported():
    inputs = make_inputs(rows=3, heads=2, width=4, lengths=[200, 250, 64], pages=8)
    table = inputs["page_table"]
    table[0, 1] = 8  # one past the end, live
    table[1, 3] = 2**31 - 1  # far past, live (250 tokens reach column 3)
    table[2, 2] = 9  # past the end but beyond the row's length: never read
    idx, _ = check_against_brute(inputs)
    assert not ((idx[0] >= 64) & (idx[0] < 128)).any()
    assert int((idx[1] >= 0).sum()) == 192  # 250 live tokens minus column 3's 58
    fault = ref.first_page_fault(table, inputs["cache_lengths"], inputs["active_width"], 8)
    assert fault == (0, 1, 8)
    table[0, 1] = 3
    assert ref.first_page_fault(table, inputs["cache_lengths"], None, 8) == (1, 3, 2**31 - 1)
    table[1, 3] = 0
    assert ref.first_page_fault(table, inputs["cache_lengths"], None, 8) is None


# --- the order: ties, signed zeros, NaN ----------------------------------------------------


def test_exact_ties_go_to_the_lowest_position():
    inputs = make_inputs(rows=2, heads=3, width=12, lengths=[700, 650])
    cache = inputs["index_k_cache"]
    cache[:, :8192] = 0  # every dot product is 0: every logit is +0.0 or -0.0
    inputs["query_weights"][0, 0] = -1.0  # w * relu(0) = -0.0
    idx, scores = check_against_brute(inputs)
    pos = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], None)
    for r in range(2):
        assert idx[r].tolist() == pos[r].nonzero().flatten()[:512].tolist()
        assert scores[r].eq(0).all()


def test_duplicate_pages_tie_at_the_boundary():
    inputs = make_inputs(rows=1, heads=2, width=16, lengths=[16 * 64], pages=16)
    inputs["page_table"][0] = torch.arange(16, dtype=torch.int32) % 8  # every K row twice
    idx, _ = check_against_brute(inputs)
    chosen = set(idx[0].tolist())
    for t in range(8 * 64, 16 * 64):  # a later copy is chosen only with its earlier twin
        assert t not in chosen or t - 8 * 64 in chosen


def test_nan_is_chosen_only_after_every_number():
    logits = torch.tensor([[float("nan"), -INF, 1.0, float("nan"), -0.0, 0.0, -5.0]])
    cand = torch.tensor([[True, True, True, True, True, True, False]])
    idx, scores = ref.select_topk(logits, cand, 512)
    assert idx[0, :6].tolist() == [2, 4, 5, 1, 0, 3]
    assert idx[0, 6:].eq(-1).all() and scores[0, 6:].eq(-INF).all()
    assert scores[0, :4].tolist() == [1.0, 0.0, 0.0, -INF] and scores[0, 4:6].isnan().all()
    keys = ref.order_keys(logits, cand)[0].tolist()
    assert keys[0] == keys[3] == 0 and keys[1] == 0x007FFFFF and keys[4] == keys[5]
    assert keys[6] == -1


@pytest.mark.parametrize("chunk", [64, 512, 1000])
def test_chunked_fold_equals_one_shot_selection(chunk):
    g = torch.Generator().manual_seed(3)
    logits = torch.randint(-20, 20, (3, 5000), generator=g).float()  # many ties
    logits[0, ::97] = float("nan")
    logits[1, ::13] = -INF
    logits[2, ::5] = -0.0
    cand = torch.rand((3, 5000), generator=g) > 0.1
    cand[2, 600:] = False  # fewer candidates than topk
    one = ref.select_topk(logits, cand, TOPK)
    folded = ref.select_topk_chunked(logits, cand, TOPK, chunk)
    assert torch.equal(one[0], folded[0])
    assert torch.equal(one[1].nan_to_num(nan=7.0), folded[1].nan_to_num(nan=7.0))


# --- the tie-aware comparison helper -------------------------------------------------------


@pytest.fixture
def solved():
    inputs = make_inputs(rows=2, heads=2, width=12, lengths=[700, 300], unmapped=((0, 3),))
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], None)
    idx, scores = ref.select_topk(logits, cand, TOPK)
    return inputs, logits, cand, idx, scores


def test_helper_accepts_any_order_within_a_row(solved):
    _, logits, cand, idx, scores = solved
    ref.assert_topk_equivalent(idx, scores, logits, cand, TOPK)
    perm = torch.randperm(TOPK)
    ref.assert_topk_equivalent(idx[:1, perm], scores[:1, perm], logits[:1], cand[:1], TOPK)


def test_helper_accepts_near_ties_and_rejects_far_swaps(solved):
    _, logits, cand, idx, scores = solved
    logits = logits.clone()
    last, outside = int(idx[0, -1]), None
    chosen = set(idx[0].tolist())
    for t in range(logits.shape[1]):
        if bool(cand[0, t]) and t not in chosen:
            outside = t
            break
    assert outside is not None
    swapped = idx.clone()
    swapped[0, -1] = outside
    sc = scores.clone()
    logits[0, outside] = logits[0, last] - 1e-5  # a near-tie with the boundary
    sc[0, -1] = logits[0, outside]
    ref.assert_topk_equivalent(swapped, sc, logits, cand, TOPK)
    logits[0, outside] = logits[0, last] - 1.0
    sc[0, -1] = logits[0, outside]
    with pytest.raises(AssertionError, match="differs from the reference beyond near-ties"):
        ref.assert_topk_equivalent(swapped, sc, logits, cand, TOPK)


@pytest.mark.parametrize("fault", ["padding first", "duplicate", "not a candidate", "score"])
def test_helper_rejects_broken_results(solved, fault):
    _, logits, cand, idx, scores = solved
    idx, scores = idx.clone(), scores.clone()
    expected = {
        "padding first": r"row 1: expected 300 indices >= 0 then 212 x -1",
        "duplicate": r"row 0: duplicate indices",
        "not a candidate": r"row 1: indices \[305\] are not candidates",
        "score": r"row 0: score .* differs from the reference logit",
    }[fault]
    if fault == "padding first":
        idx[1] = idx[1].roll(5)
    elif fault == "duplicate":
        idx[0, 1] = idx[0, 0]
    elif fault == "not a candidate":
        idx[1, 0] = 305
    else:
        scores[0, 7] += 0.5
    with pytest.raises(AssertionError, match=expected):
        ref.assert_topk_equivalent(idx, scores, logits, cand, TOPK)


def test_helper_maps_physical_indices_back(solved):
    inputs, logits, cand, idx, scores = solved
    phys = ref.to_physical(idx, inputs["page_table"])
    kw = {"page_table": inputs["page_table"], "index_space": "physical"}
    ref.assert_topk_equivalent(phys.flip(1).flip(1), scores, logits, cand, TOPK, **kw)
    bad = phys.clone()
    unused = sorted(
        set(range(inputs["index_k_cache"].shape[0])) - set(inputs["page_table"][0].tolist())
    )
    bad[0, 0] = unused[0] * 64  # a page this row does not map
    with pytest.raises(AssertionError, match="are not candidates"):
        ref.assert_topk_equivalent(bad, scores, logits, cand, TOPK, **kw)
