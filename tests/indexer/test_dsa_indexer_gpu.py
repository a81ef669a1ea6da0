"""The C4 indexer kernels on a GPU, through plan / bind / run, against ``reference``.

Grid of spec §9: heads 16/32/48/64, topk 512/1024/2048, len 0, len < topk, a
partial last page, several supertile chunks, unmapped (-1) pages, a padded
page stride, page ids whose byte offset passes 2^31, page ids past the cache
(unmapped, reported through check()), a shared page table against the same
table expanded, physical output, the two-stage top-k, exact ties and NaN,
every MMA flavor (scorer logits too), and CUDA-graph replay with rewritten
metadata. Comparisons go through ``reference.assert_topk_equivalent``
(tie-aware: index sets match except for near-ties at the boundary).
"""

from __future__ import annotations

import math
import re

import b12x
import pytest
import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref

pytestmark = pytest.mark.gpu

PAGE = 64


@pytest.fixture(autouse=True)
def _exact_fp32_reference():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


def make_case(
    rows,
    heads,
    width,
    lengths,
    *,
    mode="decode",
    page_stride=ref.PAGE_BYTES,
    pid_offset=0,
    spare_pages=0,
    unmapped=(),
    seed=0,
):
    """Operands on the GPU. Decode rows get distinct pages; prefill rows share
    one table row as a stride-0 view. Page ids start at ``pid_offset``."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(seed)
    table_rows = 1 if mode == "prefill" else rows
    used = table_rows * width + spare_pages
    pages = pid_offset + used
    k = torch.randn(used, PAGE, 128, device=dev, generator=g)
    k_fp8, scales = ref.quantize_index_k(k)
    buf = torch.zeros((pages, page_stride), dtype=torch.uint8, device=dev)
    buf[pid_offset:, :8192] = k_fp8.view(torch.uint8).reshape(used, 8192)
    buf[pid_offset:, 8192 : ref.PAGE_BYTES] = scales.view(torch.uint8).reshape(used, 256)
    perm = torch.randperm(used, device=dev, generator=g)[: table_rows * width] + pid_offset
    table = perm.reshape(table_rows, width).int()
    for r, c in unmapped:
        table[r, c] = -1
    if mode == "prefill":
        table = table.expand(rows, width)
    q = (torch.randn(rows, heads, 128, device=dev, generator=g) * 4).to(torch.float8_e4m3fn)
    return {
        "q_fp8": q,
        "query_weights": torch.randn(rows, heads, device=dev, generator=g) * heads**-0.5,
        "index_k_cache": buf[:, : ref.PAGE_BYTES],
        "page_table": table,
        "cache_lengths": torch.tensor(lengths, dtype=torch.int32, device=dev),
        "active_width": torch.tensor([max([*lengths, 0])], dtype=torch.int32, device=dev),
    }


def plan_for(inputs, topk, *, mode="decode", space="logical", supertile=0, flavor=None):
    """The interned plan, or with ``flavor`` an uncached plan whose scorers use
    that MMA flavor (the test-only plan option)."""
    rows, heads, _ = inputs["q_fp8"].shape
    caps = di.Caps(
        device=inputs["q_fp8"].device,
        num_q_heads=heads,
        max_q_rows=rows,
        max_page_table_width=inputs["page_table"].shape[1],
        topk=topk,
        mode=mode,
        output_index_space=space,
        supertile_tokens=supertile,
    )
    if flavor is None:
        return di.plan(caps)
    plan = _core.indexer_build_plan(caps, mma_flavor=flavor)
    assert plan.mma_flavor == flavor and f"mma_flavor={flavor}" in repr(plan)
    return plan


def bind_for(plan, inputs, *, scores=True):
    rows = inputs["q_fp8"].shape[0]
    # poison: values no run writes, so a skipped slot shows
    out = torch.full((rows, plan.topk), 7777, dtype=torch.int32, device="cuda")
    sc = torch.full((rows, plan.topk), float("nan"), device="cuda") if scores else None
    scratch = torch.full((plan.nbytes,), 0xA5, dtype=torch.uint8, device="cuda")
    b = di.bind(plan, scratch=scratch, output_indices=out, output_scores=sc, **inputs)
    return b, out, sc


def run_case(inputs, topk, **kw):
    plan = plan_for(inputs, topk, **kw)
    b, out, sc = bind_for(plan, inputs)
    di.run(b)
    torch.cuda.synchronize()
    return plan, out, sc


def check(inputs, topk, out, sc, *, space="logical"):
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], inputs["active_width"])
    ref.assert_topk_equivalent(
        out, sc, logits, cand, topk, page_table=inputs["page_table"], index_space=space
    )


def require_hopper(why="the fast flavors are Hopper's"):
    """Skips the calling test off sm_90, where the kernels it names do not run."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(why)


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("heads", [16, 32, 64])
@pytest.mark.parametrize("topk", [512, 1024, 2048])
# 3 chunks of 1024, or one chunk (on sm_90: the cluster selection)
@pytest.mark.parametrize("supertile", [1024, 0])
def test_decode_grid(heads, topk, supertile):
    width = 48  # 3072 K rows
    lengths = [0, topk // 2 + 3, width * PAGE - 37, 2000, 64, width * PAGE]
    inputs = make_case(len(lengths), heads, width, lengths, seed=heads + topk)
    plan, out, sc = run_case(inputs, topk, supertile=supertile)
    assert plan.max_chunks == (3 if supertile else 1)
    check(inputs, topk, out, sc)


@pytest.mark.parametrize("heads", [16, 48, 64])
def test_decode_default_plan(heads):
    inputs = make_case(3, heads, 200, [5000, 777, 12000], seed=3)
    _, out, sc = run_case(inputs, 512)
    check(inputs, 512, out, sc)


def test_unmapped_pages_are_not_candidates():
    width = 40
    unmapped = ((0, 3), (0, 17), (0, 39), (1, 0), (1, 5), (2, 2), (2, 10))
    inputs = make_case(3, 64, width, [width * PAGE, 1500, 700], unmapped=unmapped, seed=5)
    for topk in (512, 1024):
        _, out, sc = run_case(inputs, topk, supertile=1024)
        check(inputs, topk, out, sc)


def test_padded_stride_and_page_ids_past_2_31_bytes():
    stride = (1 << 20) + 16  # page ids >= 2048 start past byte 2^31
    width = 24
    inputs = make_case(2, 32, width, [width * PAGE, 1000], page_stride=stride, pid_offset=2048)
    assert int(inputs["page_table"].min()) * stride > 2**31
    _, out, sc = run_case(inputs, 512, supertile=512)
    check(inputs, 512, out, sc)


@pytest.mark.parametrize("heads", [32, 64])
def test_shared_prefill_matches_expanded_table(heads):
    rows, width = 96, 40
    top = width * PAGE - 11
    lengths = [top - rows + 1 + i for i in range(rows)]
    lengths[5], lengths[6] = 0, 300
    shared = make_case(rows, heads, width, lengths, mode="prefill", unmapped=((0, 7),), seed=11)
    assert shared["page_table"].stride(0) == 0
    _, out_p, sc_p = run_case(shared, 512, mode="prefill", supertile=1024)
    check(shared, 512, out_p, sc_p)
    expanded = {**shared, "page_table": shared["page_table"].contiguous()}
    _, out_d, sc_d = run_case(expanded, 512, supertile=1024)
    check(expanded, 512, out_d, sc_d)
    same = sum(set(a) == set(b) for a, b in zip(out_p.tolist(), out_d.tolist(), strict=True))
    assert same >= rows - 2  # both exact; near-ties may differ in a row or two


@pytest.mark.parametrize("supertile", [1024, 0])
def test_physical_output(supertile):
    width = 32
    inputs = make_case(3, 64, width, [width * PAGE, 900, 0], unmapped=((1, 4),), seed=13)
    _, out, sc = run_case(inputs, 1024, supertile=supertile, space="physical")
    check(inputs, 1024, out, sc, space="physical")
    pages = set(inputs["page_table"][0].tolist())
    assert all(i // PAGE in pages for i in out[0].tolist())


@pytest.mark.parametrize("supertile", [0, 16384])
def test_two_stage_top_k(supertile):
    width = 512  # 32768 K rows
    lengths = [width * PAGE, 20000, 300, width * PAGE - 100]
    inputs = make_case(4, 64, width, lengths, unmapped=((1, 9),), seed=17)
    for topk in (512, 2048):
        plan, out, sc = run_case(inputs, topk, supertile=supertile)
        assert plan.topk_slices > 1
        check(inputs, topk, out, sc)


def test_exact_ties_pick_the_lowest_positions():
    # every token is the same K row with the same scale: bit-identical logits
    rows, width = 2, 40
    inputs = make_case(rows, 64, width, [width * PAGE, 1500], seed=19)
    cache = inputs["index_k_cache"]
    cache[:, :8192] = cache[0, :128].repeat(64)
    cache[:, 8192 : ref.PAGE_BYTES] = cache[0, 8192:8196].repeat(64)
    for supertile in (1024, 0):
        _, out, _ = run_case(inputs, 512, supertile=supertile)
        for r in range(rows):
            assert sorted(out[r].tolist()) == list(range(512))


@pytest.mark.parametrize("supertile", [512, 0])
def test_negative_weights_and_nan_logits(supertile):
    rows, width = 2, 24
    inputs = make_case(rows, 16, width, [width * PAGE, 1000], seed=23)
    inputs["query_weights"].copy_(-inputs["query_weights"].abs())  # logits <= 0, ties at 0
    pid = int(inputs["page_table"][0, 0])
    nan = torch.full((64,), float("nan"), device="cuda").view(torch.uint8)
    inputs["index_k_cache"][pid, 8192 : ref.PAGE_BYTES] = nan  # NaN logits on one page
    _, out, sc = run_case(inputs, 512, supertile=supertile)
    check(inputs, 512, out, sc)
    assert not bool(torch.isnan(sc[0]).any())  # enough numbers: NaN never selected


def edge_case_inputs(width):
    """Four rows over `width` pages with the one-chunk selection's edge cases:
    row 0 has 192 NaN logits among its 600 tokens, row 1 3008 logits of +-0
    (scale 0) on top of its numbers, row 2 every token the same K row and
    scale (every logit equal), row 3 no tokens; every logit <= 0. Returns the
    inputs and row 1's zero positions."""
    rows = 4
    lengths = [600, width * PAGE, width * PAGE - 5, 0]
    inputs = make_case(rows, 16, width, lengths, seed=47)
    inputs["query_weights"].copy_(-inputs["query_weights"].abs())  # logits <= 0
    nan = torch.full((64,), float("nan"), device="cuda").view(torch.uint8)
    for c in range(3):  # row 0: 192 NaN logits among its 600 tokens
        inputs["index_k_cache"][int(inputs["page_table"][0, c]), 8192 : ref.PAGE_BYTES] = nan
    cache = inputs["index_k_cache"]
    src = int(inputs["page_table"][1, 0])
    for c in range(width):  # row 2: every token the same K row, the same scale
        pid = int(inputs["page_table"][2, c])
        cache[pid, :8192] = cache[src, :128].repeat(64)
        cache[pid, 8192 : ref.PAGE_BYTES] = cache[src, 8192:8196].repeat(64)
    for c in range(10, 57):  # row 1: 3008 logits of +-0 (scale 0) on top of the row's
        cache[int(inputs["page_table"][1, c]), 8192 : ref.PAGE_BYTES] = 0
    logits = ref.paged_logits(**inputs)
    zeros = torch.nonzero(logits[1, : lengths[1]] == 0).flatten().tolist()
    assert len(zeros) >= 3008 and bool((logits[1, : lengths[1]] <= 0).all())
    return inputs, zeros


# 600 pages: a cluster of 8 CTAs per row; 2048 pages (131072 logits) and at
# most 4 rows: the widest cluster the launcher picks.
@pytest.mark.parametrize("width", [600, 2048])
def test_one_chunk_selection_edge_cases(width):
    # the one-chunk selection (on sm_90 a cluster per row, or for 2048 pages
    # a grid of CTAs per row): NaN logits selected when the numbers run out,
    # +-0 ties, every logit equal across a long row. Twice on the same
    # binding, its scratch poisoned first: the second call runs on the row
    # state the first left (the scorer clears it).
    inputs, zeros = edge_case_inputs(width)
    for topk in (512, 2048):
        plan = plan_for(inputs, topk)
        assert plan.max_chunks == 1
        b, out, sc = bind_for(plan, inputs)
        for _ in range(2):
            out.fill_(7777)
            di.run(b)
            torch.cuda.synchronize()
            check(inputs, topk, out, sc)
            assert sorted(out[2].tolist()) == list(range(topk))  # ties: the lowest positions
            # more ties than slots in the k-th key's bin (the grid selection's candidates)
            assert sorted(out[1].tolist()) == zeros[:topk]
            assert bool(torch.isnan(sc[0]).any()) == (topk > 600 - 192)
            assert bool((out[3] == -1).all())


@pytest.mark.parametrize("flavor", [None, "tma_fp8"])
def test_two_long_rows_select_over_the_widest_grid(flavor):
    # rows 1 and 2 of the edge cases alone (+-0 ties past the candidates'
    # bin, every logit equal): two rows of 131072 logits take the grid
    # selection at its most CTAs a row (2 logits a thread), both precisions
    if flavor is not None:
        require_hopper()
    inputs, zeros = edge_case_inputs(2048)
    per_row = ("q_fp8", "query_weights", "page_table", "cache_lengths")
    two = {**inputs, **{k: inputs[k][1:3].contiguous() for k in per_row}}
    for topk in (512, 2048):
        plan = plan_for(two, topk, flavor=flavor)
        assert plan.max_chunks == 1
        b, out, sc = bind_for(plan, two)
        for _ in range(2):  # the second call on the state the first left
            out.fill_(7777)
            di.run(b)
            torch.cuda.synchronize()
            if flavor is None:
                check(two, topk, out, sc)
                assert sorted(out[0].tolist()) == zeros[:topk]
            else:
                check_fast(two, topk, plan, b, out, sc)
            assert sorted(out[1].tolist()) == list(range(topk))


@pytest.mark.parametrize("width", [600, 2048])
def test_one_chunk_selection_edge_cases_after_the_fast_scorer(width):
    # the same rows after the fast TMA decode scorer (on 2048 pages, the
    # grid selection after it), twice on one binding as above
    require_hopper()
    inputs, _ = edge_case_inputs(width)
    for topk in (512, 2048):
        plan = plan_for(inputs, topk, flavor="tma_fp8")
        assert plan.max_chunks == 1
        b, out, sc = bind_for(plan, inputs)  # scratch poisoned with 0xA5
        for _ in range(2):  # then a second call on the state the first one left
            out.fill_(7777)
            di.run(b)
            torch.cuda.synchronize()
            check_fast(inputs, topk, plan, b, out, sc)
            # equal inputs give equal FP8 logits: the ties' lowest positions
            assert sorted(out[2].tolist()) == list(range(topk))
            assert bool(torch.isnan(sc[0]).any()) == (topk > 600 - 192)
            assert bool((out[3] == -1).all())


@pytest.mark.parametrize("width", [600, 2048])
@pytest.mark.parametrize("flavor", [None, "tma_fp8"])
def test_one_chunk_selection_scores_are_the_logits_bit_for_bit(width, flavor):
    # the one-chunk selections (a cluster a row on 600 pages, the grid on
    # 2048) score each selected position with its logit in the scratch, bit
    # for bit: NaNs, -0, negative numbers (every logit of these rows is <= 0)
    if flavor is not None:
        require_hopper()
    inputs, _ = edge_case_inputs(width)
    for topk in (512, 2048):
        plan = plan_for(inputs, topk, flavor=flavor)
        assert plan.max_chunks == 1
        b, out, sc = bind_for(plan, inputs)
        di.run(b)
        torch.cuda.synchronize()
        logits = di.scratch_views(b)["logits"]
        for r in range(out.shape[0]):
            pos = out[r][out[r] >= 0].long()
            got = sc[r, : pos.numel()].contiguous().view(torch.int32)
            want = logits[r, pos].contiguous().view(torch.int32)
            assert torch.equal(got, want), f"row {r}, topk {topk}"
        # row 1's best are its zeros, nearly all -0 (a negative sum times
        # scale 0); their selection key is +0's, so a score rebuilt from the
        # key would lose the sign
        zeros = logits[1, out[1].long()]
        assert bool((zeros == 0).all()) and bool(torch.signbit(zeros).any())


# The inexact flavors (FP8 wgmma accumulation), sm_90 only; tma_fp8 is the default.
FAST_FLAVORS = ("wgmma_fp8", "tma_fp8")


def device_flavors(*, fast=False):
    """The exact MMA flavors this device runs: e4m3 mma.sync (native on sm_89 /
    sm_120, driver-emulated on sm_90), f16 mma.sync, wgmma and tma_f16 (sm_90
    only); with ``fast`` also the fast ones (FAST_FLAVORS, sm_90 only)."""
    if torch.cuda.get_device_capability() == (9, 0):
        return ("e4m3", "f16", "wgmma", "tma_f16") + (FAST_FLAVORS if fast else ())
    return ("e4m3", "f16")


def logit_magnitude(inputs):
    """``scale * sum_h |w_h| * |q_h . k|`` per (row, position): what the fast
    precision's 1e-3 is relative to (``|logit|`` itself when no term is negative)."""
    q = inputs["q_fp8"].float()
    rows, heads, _ = q.shape
    w = inputs["query_weights"].reshape(rows, heads).float().abs()
    cache, table = inputs["index_k_cache"], inputs["page_table"]
    k_all, s_all = ref.unpack_index_k_cache(cache)
    out = torch.zeros(rows, table.shape[1] * PAGE, device=q.device)
    for r in range(rows):
        pids = table[r].long().clamp(0, cache.shape[0] - 1)
        k = k_all[pids].float().reshape(-1, 128)
        out[r] = (q[r] @ k.T).abs().mul(w[r, :, None]).sum(0) * s_all[pids].reshape(-1).abs()
    return out


# More rows than SMs: the fold's stream kernel (no stage, several CTAs per SM).
@pytest.mark.parametrize("topk", [512, 2048])
@pytest.mark.parametrize("supertile", [1024, 0])  # 3 chunks with a carry, or one
def test_more_rows_than_multiprocessors(topk, supertile):
    width = 48  # 3072 K rows
    rows = torch.cuda.get_device_properties(0).multi_processor_count + 37
    cycle = [width * PAGE, 0, 1, topk - 1, topk, topk + 1, width * PAGE - 37, 1500, 2049]
    lengths = [cycle[r % len(cycle)] for r in range(rows)]
    inputs = make_case(rows, 16, width, lengths, unmapped=((0, 3), (9, 0), (18, 40)), seed=topk)
    cache, table = inputs["index_k_cache"], inputs["page_table"]
    nan = torch.full((64,), float("nan"), device="cuda").view(torch.uint8)
    cache[int(table[0, 5]), 8192 : ref.PAGE_BYTES] = nan  # row 0: NaN logits on one page
    src = int(table[9, 1])
    for c in range(1, width):  # row 9 (page 0 unmapped): every token the same K row and scale
        cache[int(table[9, c]), :8192] = cache[src, :128].repeat(64)
        cache[int(table[9, c]), 8192 : ref.PAGE_BYTES] = cache[src, 8192:8196].repeat(64)
    inputs["query_weights"][18].copy_(-inputs["query_weights"][18].abs())  # row 18: <= 0
    plan, out, sc = run_case(inputs, topk, supertile=supertile)
    assert plan.max_chunks == (3 if supertile else 1)
    check(inputs, topk, out, sc)
    assert sorted(out[9].tolist()) == list(range(PAGE, PAGE + topk))  # ties: the lowest live


# The stream kernel over several rounds of a row (8192 keys a round): rows
# ending in each round and on its edges, and non-candidates (two unmapped
# pages) in the second round, which the first bound counts.
@pytest.mark.parametrize("topk", [512, 2048])
def test_stream_rows_over_several_rounds(topk):
    width = 400  # 25600 K rows: four rounds
    rows = torch.cuda.get_device_properties(0).multi_processor_count + 37
    cycle = [width * PAGE, 8192, 8193, 12000, 16384, 16385, 20000, 0, 1, topk, 24577]
    lengths = [cycle[r % len(cycle)] for r in range(rows)]
    unmapped = ((0, 130), (0, 250))  # tokens 8320-8383 and 16000-16063
    inputs = make_case(rows, 16, width, lengths, mode="prefill", unmapped=unmapped, seed=topk + 5)
    plan, out, sc = run_case(inputs, topk, mode="prefill")
    assert plan.max_chunks == 1
    check(inputs, topk, out, sc)


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("heads", [16, 20, 48, 64])  # 20: padded to 32 with zero Q and weights
def test_scorer_logits_match_reference_per_flavor(mode, heads):
    # The scorer's logits chunk itself (not only the top-k it feeds), per MMA
    # flavor: a wrong operand layout shows here as the tokens and rows it hits.
    rows, width = 9, 14  # 9 rows: two prefill CTAs of 4 rows and a ragged one
    lengths = [width * PAGE - 37 * i for i in range(rows)]
    inputs = make_case(rows, heads, width, lengths, mode=mode, unmapped=[(0, 5)], seed=heads)
    expected = ref.paged_logits(**inputs)
    for flavor in device_flavors():
        plan = plan_for(inputs, 512, mode=mode, supertile=1024, flavor=flavor)  # one chunk
        b, _, _ = bind_for(plan, inputs)
        di.run(b)
        torch.cuda.synchronize()
        check_exact_logits(inputs, b, expected, f"flavor {flavor}")


def check_exact_logits(inputs, b, expected, what):
    """A one-chunk run's logits (its scratch) against the reference's: every
    candidate within 1e-4, every other live position "not a candidate"."""
    table, lengths = inputs["page_table"], inputs["cache_lengths"]
    cand = ref.candidate_mask(table, lengths, pages=inputs["index_k_cache"].shape[0])
    limits = ref.candidate_limits(table, lengths).tolist()
    rows, width = table.shape
    got = di.scratch_views(b)["logits"][:rows, : width * PAGE]
    for r in range(rows):
        live = slice(0, limits[r])
        c = cand[r, live]
        g, e = got[r, live], expected[r, live]
        bad = ~torch.isclose(g[c], e[c], rtol=1e-4, atol=1e-4)
        assert not bool(bad.any()), (
            f"{what} row {r}: {int(bad.sum())} of {int(c.sum())} logits "
            f"differ, first at token {int(torch.nonzero(c)[bad][0])}"
        )
        skipped = g[~c].view(torch.int32)
        assert bool((skipped == -1).all()), f"{what} row {r}: unmapped page"


def test_exact_tma_prefill_restages_q_between_segments():
    # tma_f16 with more work units than SMs: a CTA's units span row blocks,
    # so its warpgroups restage Q and the weights between segments. Its
    # logits against the reference and the wgmma flavor's (both exact), and
    # its selection.
    require_hopper("tma_f16 is sm_90's")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    width = 40  # 2560 tokens: one chunk of a 2560-token supertile
    rows = 8 * (sms // 2 + 3)  # row blocks of 8: about 2.5 units of 8 pages a CTA
    lengths = [width * PAGE - 5 * r for r in range(rows)]
    inputs = make_case(rows, 64, width, lengths, mode="prefill", unmapped=[(0, 7)], seed=77)
    expected = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"])
    got = {}
    for flavor in ("tma_f16", "wgmma"):
        plan = plan_for(inputs, 512, mode="prefill", supertile=width * PAGE, flavor=flavor)
        assert plan.max_chunks == 1
        b, out, sc = bind_for(plan, inputs)
        di.run(b)
        torch.cuda.synchronize()
        got[flavor] = di.scratch_views(b)["logits"][:rows, : width * PAGE].clone()
        check(inputs, 512, out, sc)
    tma, wg = got["tma_f16"], got["wgmma"]
    bad = ~torch.isclose(tma[cand], expected[cand], rtol=1e-4, atol=1e-4)
    assert not bool(bad.any()), f"{int(bad.sum())} of {int(cand.sum())} logits differ"
    # the same exact products and fp32 sums, in another order at most
    scale = expected[cand].abs().max()
    assert float((tma[cand] - wg[cand]).abs().max()) <= 1e-5 * float(scale)
    # an unmapped page's live positions hold "not a candidate"
    limits = ref.candidate_limits(inputs["page_table"], inputs["cache_lengths"]).to(tma.device)
    live = torch.arange(width * PAGE, device=tma.device)[None, :] < limits[:, None]
    skipped = tma[live & ~cand].view(torch.int32)
    assert skipped.numel() > 0 and bool((skipped == -1).all()), "an unmapped page was scored"


@pytest.mark.parametrize("heads", [16, 48, 64])
def test_every_mma_flavor(heads):
    # every flavor this device runs, on decode and on shared-table prefill
    rows, width = 70, 30
    lengths = [width * PAGE - 3 - i for i in range(rows)]
    lengths[0] = 0
    decode = make_case(rows, heads, width, lengths, seed=heads + 1)
    prefill = make_case(rows, heads, width, lengths, mode="prefill", seed=heads + 2)
    for flavor in device_flavors():
        _, out, sc = run_case(decode, 512, supertile=1024, flavor=flavor)
        check(decode, 512, out, sc)
        _, out, sc = run_case(prefill, 512, mode="prefill", supertile=1024, flavor=flavor)
        check(prefill, 512, out, sc)


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_page_ids_past_the_cache_are_unmapped_and_reported(mode):
    # No fault, never selected, and the first one readable through check().
    rows, width = 5, 24
    lengths = [width * PAGE, 900, 0, 700, 1200]
    inputs = make_case(rows, 64, width, lengths, mode=mode, seed=37)
    pages = inputs["index_k_cache"].shape[0]
    table = inputs["page_table"]
    base = table[:1] if mode == "prefill" else table
    bad = {(0, 5): pages, (0, 11): 2**31 - 1}  # one past the end; 18 TB past the base
    if mode == "decode":
        bad[(1, 2)] = pages + 7
        base[2, 0] = pages + 1  # row 2 has no live token: never read, never reported
        base[3, 13] = 2**30  # past row 3's 700 tokens (11 columns): never read
    for (r, c), pid in bad.items():
        base[r, c] = pid
    live = {
        (r, c)
        for r in range(rows)
        for c in range(width)
        if int(table[r, c]) >= pages and c * PAGE < lengths[r]
    }
    cand = ref.candidate_mask(table, inputs["cache_lengths"], pages=pages)
    logits = ref.paged_logits(**inputs)
    di.check("cuda")  # no earlier test left a record
    for flavor in device_flavors(fast=True):
        # the fast flavor's logits are not the reference's: check only that every
        # selected index is a candidate (the near-tie tolerance covers the rest)
        tol = {} if flavor not in FAST_FLAVORS else {"tie_atol": math.inf, "score_atol": math.inf}
        for space in ("logical", "physical"):
            plan = plan_for(inputs, 512, mode=mode, space=space, supertile=1024, flavor=flavor)
            b, out, sc = bind_for(plan, inputs)
            di.run(b)
            torch.cuda.synchronize()
            ref.assert_topk_equivalent(
                out, sc, logits, cand, 512, page_table=table, index_space=space, **tol
            )
            if space == "physical":
                assert int(out.max()) < pages * PAGE
            with pytest.raises(b12x.PageTableError) as e:
                b.check()
            m = re.match(
                r"run: page_table\[(\d+), (\d+)\] expected a page id in \[0, (\d+)\) "
                r"\(the pages of index_k_cache\) or negative \(unmapped\), got (\d+)",
                str(e.value),
            )
            assert m, str(e.value)
            row, col, bound, pid = (int(g) for g in m.groups())
            assert (row, col) in live and bound == pages and pid == int(table[row, col])
            b.check()  # cleared


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize("heads", [16, 64])
def test_fast_precision_keeps_its_contract(mode, heads):
    # precision="fast": logits within 1e-3 of the fp32 reference relative to
    # their magnitude; the selected set equal to the reference's except for
    # indices within that tolerance of the k-th value (both sides may move).
    rows, width, topk = 9, 40, 512
    lengths = [width * PAGE - 37 * i for i in range(rows)]
    inputs = make_case(rows, heads, width, lengths, mode=mode, unmapped=[(0, 5)], seed=41 + heads)
    caps = di.Caps(
        device="cuda",
        num_q_heads=heads,
        max_q_rows=rows,
        max_page_table_width=width,
        topk=topk,
        mode=mode,
        precision="fast",
    )
    plan = di.plan(caps)
    exact = plan_for(inputs, topk, mode=mode)
    hopper = torch.cuda.get_device_capability() == (9, 0)
    assert plan.precision == "fast" and exact.precision == "exact"
    assert plan.mma_flavor == ("tma_fp8" if hopper else exact.mma_flavor)
    assert "precision=fast, mma_flavor=" + plan.mma_flavor in repr(plan)
    assert plan.max_chunks == 1  # the logits region holds every position
    b, out, sc = bind_for(plan, inputs)
    di.run(b)
    torch.cuda.synchronize()
    expected = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"])
    mag = logit_magnitude(inputs)
    got = di.scratch_views(b)["logits"][:rows, : width * PAGE]
    worst = 0.0
    for r in range(rows):
        c = cand[r, : lengths[r]]
        g, e, m = got[r, : lengths[r]][c], expected[r, : lengths[r]][c], mag[r, : lengths[r]][c]
        err = (g - e).abs()
        worst = max(worst, float((err / m.clamp(min=1e-30)).max()))
        assert bool((err <= 1e-3 * m).all()), f"row {r}: {float((err / m).max()):.2e} relative"
        tol = 1e-3 * float(m.max())
        ref.assert_topk_equivalent(
            out[r : r + 1], sc[r : r + 1], expected[r : r + 1], cand[r : r + 1], topk,
            tie_atol=2 * tol, tie_rtol=0.0, score_atol=tol,
        )  # fmt: skip
    print(f"{plan.mma_flavor}: worst logit error {worst:.2e} of its magnitude")


def check_fast(inputs, topk, plan, b, out, sc):
    """A fast flavor's call: logits (one-chunk plans) within 1e-3 of the fp32
    reference relative to their magnitude, the selection tie-aware within it."""
    expected = ref.paged_logits(**inputs)
    pages = inputs["index_k_cache"].shape[0]  # ids past the cache are not candidates
    cand = ref.candidate_mask(
        inputs["page_table"], inputs["cache_lengths"], inputs["active_width"], pages=pages
    )
    mag = logit_magnitude(inputs)
    tol = 1e-3 * float(mag.nan_to_num(0.0).max())  # NaN scales: NaN logits, no magnitude
    if plan.max_chunks == 1:
        rows = inputs["q_fp8"].shape[0]
        width = inputs["page_table"].shape[1]
        got = di.scratch_views(b)["logits"][:rows, : width * PAGE]
        limits = ref.candidate_limits(inputs["page_table"], inputs["cache_lengths"]).tolist()
        for r in range(rows):
            c = cand[r, : limits[r]]
            g, e, m = got[r, : limits[r]][c], expected[r, : limits[r]][c], mag[r, : limits[r]][c]
            nan = torch.isnan(e)
            assert torch.equal(torch.isnan(g), nan), f"row {r}: NaN logits differ"
            g, e, m = g[~nan], e[~nan], m[~nan]
            err = (g - e).abs()
            assert bool((err <= 1e-3 * m).all()), f"row {r}: {float((err / m).max()):.2e} relative"
            skipped = got[r, : limits[r]][~c].view(torch.int32)
            assert bool((skipped == -1).all()), f"row {r}: a non-candidate was scored"
    ref.assert_topk_equivalent(
        out, sc, expected, cand, topk, page_table=inputs["page_table"],
        index_space=plan.caps.output_index_space, tie_atol=2 * tol, tie_rtol=0.0, score_atol=tol,
    )  # fmt: skip


@pytest.mark.parametrize("mode", ["decode", "prefill"])
@pytest.mark.parametrize(
    "rows,heads,width,lengths,supertile",
    [
        # many rows of uneven length: CTAs' work ranges span rows and row blocks
        (70, 64, 30, [30 * PAGE - 3 - 27 * i for i in range(70)], 1024),
        # ragged heads (padded with zeros), lengths 0 and below topk, a partial page
        (13, 20, 12, [0, 5, 511, 512, 700, 12 * PAGE, 1, 64, 65, 300, 640, 0, 767], 0),
        # several chunks with a carry
        (3, 48, 40, [40 * PAGE, 33 * PAGE - 5, 1000], 1024),
        # one long row over every SM
        (1, 64, 600, [600 * PAGE - 17], 0),
    ],
)
def test_fast_flavors_against_the_reference(mode, rows, heads, width, lengths, supertile):
    require_hopper()
    inputs = make_case(rows, heads, width, lengths, mode=mode, unmapped=[(0, 1)], seed=rows + heads)
    for flavor in FAST_FLAVORS:
        for space in ("logical", "physical"):
            plan = plan_for(inputs, 512, mode=mode, space=space, supertile=supertile, flavor=flavor)
            b, out, sc = bind_for(plan, inputs)
            di.run(b)
            torch.cuda.synchronize()
            check_fast(inputs, 512, plan, b, out, sc)


def test_fast_flavors_with_a_padded_page_stride_and_far_page_ids():
    require_hopper()
    # page ids whose byte offset passes 2^31 (the tensor map's page stride is 64-bit)
    stride = (1 << 20) + 16
    inputs = make_case(4, 64, 8, [8 * PAGE, 300, 8 * PAGE - 1, 64], page_stride=stride,
                       pid_offset=2048, seed=91)  # fmt: skip
    assert int(inputs["page_table"].min()) * stride > 2**31
    for flavor in FAST_FLAVORS:
        plan = plan_for(inputs, 512, flavor=flavor)
        b, out, sc = bind_for(plan, inputs)
        di.run(b)
        torch.cuda.synchronize()
        check_fast(inputs, 512, plan, b, out, sc)


@pytest.mark.parametrize("flavor", ["tma_f16", "tma_fp8"])
def test_tma_decode_scores_long_segments_at_their_logical_positions(flavor):
    # Decode CTAs whose work crosses row ends: 8 rows of 1100 pages, about 67
    # pages a CTA, so segments longer and shorter than the producer's ring;
    # every logit must land at its logical position. Unmapped pages, an id
    # past the cache (reported), partial last pages, an empty row.
    require_hopper("the TMA scorers are Hopper's")
    rows, width = 8, 1100
    lengths = [width * PAGE, width * PAGE - 37, 700 * PAGE + 5, 900 * PAGE, 0, 1,
               width * PAGE - 64, 2000]  # fmt: skip
    inputs = make_case(rows, 64, width, lengths, unmapped=[(0, 1), (0, 600), (3, 899), (6, 0)],
                       seed=53)  # fmt: skip
    table, pages = inputs["page_table"], inputs["index_k_cache"].shape[0]
    table[1, 500] = pages + 3
    plan = plan_for(inputs, 512, flavor=flavor)
    assert plan.max_chunks == 1  # the logits region holds every position
    b, out, sc = bind_for(plan, inputs)
    di.run(b)
    torch.cuda.synchronize()
    with pytest.raises(b12x.PageTableError, match=r"page_table\[1, 500\]"):
        b.check()
    if flavor == "tma_fp8":
        check_fast(inputs, 512, plan, b, out, sc)
        return
    expected = ref.paged_logits(**inputs)
    check_exact_logits(inputs, b, expected, flavor)
    cand = ref.candidate_mask(table, inputs["cache_lengths"], pages=pages)
    ref.assert_topk_equivalent(out, sc, expected, cand, 512, page_table=table)


# 4 short rows (a cluster selection each), and one row of 131072 logits (on
# sm_90 the grid selection, whose row state a top-k-only call clears itself)
@pytest.mark.parametrize("width,lengths", [(64, [4096, 3000, 100, 0]), (2048, [2048 * PAGE - 5])])
def test_a_topk_only_plan_reselects_the_logits_in_the_scratch(width, lengths):
    # the benchmark's topk_only arm: the top-k stage alone, on a full run's logits
    inputs = make_case(len(lengths), 64, width, lengths, unmapped=[(0, 3)], seed=43)
    plan = plan_for(inputs, 512)
    assert plan.max_chunks == 1 and not plan.topk_only
    b, out, sc = bind_for(plan, inputs)
    di.run(b)
    stage = _core.indexer_build_plan(plan.caps, topk_only=True)
    assert stage.topk_only and repr(stage).endswith(", stages=topk_only)")
    out2 = torch.full_like(out, 7777)
    sc2 = torch.full_like(sc, float("nan"))
    b2 = di.bind(stage, scratch=b.scratch, output_indices=out2, output_scores=sc2, **inputs)
    for _ in range(2):  # the second on the state the first left
        out2.fill_(7777)
        di.run(b2)
        torch.cuda.synchronize()
        check(inputs, 512, out2, sc2)
        assert torch.equal(out.sort(dim=1).values, out2.sort(dim=1).values)
        assert torch.equal(sc.sort(dim=1).values, sc2.sort(dim=1).values)


def test_a_score_only_plan_writes_the_logits_and_leaves_the_outputs():
    # the benchmark's score_only arm: the scorer alone, the same logits as a full run
    inputs = make_case(4, 64, 64, [4096, 3000, 100, 0], unmapped=[(1, 3)], seed=44)
    plan = plan_for(inputs, 512)
    b, out, _ = bind_for(plan, inputs)
    di.run(b)
    torch.cuda.synchronize()
    logits = di.scratch_views(b)["logits"].clone()
    stage = _core.indexer_build_plan(plan.caps, score_only=True)
    assert stage.score_only and not stage.topk_only
    out2 = torch.full_like(out, 7777)
    scratch = torch.full_like(b.scratch, 0xAB)
    b2 = di.bind(stage, scratch=scratch, output_indices=out2, output_scores=None, **inputs)
    di.run(b2)
    torch.cuda.synchronize()
    assert torch.all(out2 == 7777)
    lengths = inputs["cache_lengths"].tolist()
    again = di.scratch_views(b2)["logits"]
    for r, n in enumerate(lengths):
        assert torch.equal(again[r, :n].view(torch.int32), logits[r, :n].view(torch.int32))


def test_run_without_scores():
    inputs = make_case(2, 32, 16, [1000, 100], seed=27)
    plan = plan_for(inputs, 512)
    b, out, _ = bind_for(plan, inputs, scores=False)
    di.run(b)
    torch.cuda.synchronize()
    check(inputs, 512, out, None)


@pytest.mark.parametrize(
    ("mode", "supertile"), [("decode", 1024), ("decode", 0), ("prefill", 1024)]
)
def test_graph_replay_with_rewritten_metadata(mode, supertile):
    rows, width, topk = 4, 64, 512
    inputs = make_case(rows, 64, width, [2000, 4096, 0, 600], mode=mode, spare_pages=8, seed=29)
    plan = plan_for(inputs, topk, mode=mode, supertile=supertile)
    b, out, sc = bind_for(plan, inputs)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        di.run(b)  # warm-up off the capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        di.run(b)
    graph.replay()
    torch.cuda.synchronize()
    check(inputs, topk, out, sc)
    # rewrite the table (onto the spare pages too), the lengths and active_width in place
    g = torch.Generator(device="cuda").manual_seed(31)
    table = inputs["page_table"]
    base = table[:1] if mode == "prefill" else table
    n = base.numel()
    base.copy_(torch.randperm(n + 8, device="cuda", generator=g)[:n].reshape(base.shape).int())
    inputs["cache_lengths"].copy_(torch.tensor([width * PAGE, 100, 3000, 0], dtype=torch.int32))
    inputs["active_width"].fill_(width * PAGE)
    out.fill_(-7)
    sc.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    check(inputs, topk, out, sc)


def test_is_supported_on_this_gpu():
    major, minor = _core.device_info(0)["compute_capability"]
    assert di.is_supported() is ((major, minor) >= (8, 9))
