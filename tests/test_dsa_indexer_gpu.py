"""The C4 indexer kernels on a GPU against a pure-PyTorch reference.

Grid of spec §9: heads 16/32/64, topk 512/1024/2048, len 0, len < topk, a
partial last page, several supertile chunks, unmapped (-1) pages, a padded
page stride, page ids whose byte offset passes 2^31, a shared page table
against the same table expanded, physical output, the two-stage top-k, exact
ties, and CUDA-graph replay with rewritten metadata. The comparison is
tie-aware: index sets must match except for near-ties at the boundary.
"""

from __future__ import annotations

import math

import pytest
import torch

pytestmark = pytest.mark.gpu

PAGE = 64
PAGE_BYTES = 8448


# ------------------------------------------------------------------ reference


def pack_cache(k_fp8: torch.Tensor, scales: torch.Tensor, page_stride: int) -> torch.Tensor:
    """Planar pages ([0, 8192) e4m3 values, [8192, 8448) f32 scales) with a
    ``page_stride``-byte stride; returns the ``[pages, 8448]`` uint8 view."""
    pages = k_fp8.shape[0]
    buf = torch.zeros((pages, page_stride), dtype=torch.uint8, device=k_fp8.device)
    buf[:, :8192] = k_fp8.view(torch.uint8).reshape(pages, 8192)
    buf[:, 8192:PAGE_BYTES] = scales.float().contiguous().view(torch.uint8).reshape(pages, 256)
    return buf[:, :PAGE_BYTES]


def ref_logits(q, w, kcache, page_table, lengths, active_width):
    """(logits f32 [rows, width*64], candidate mask) per the spec's §3."""
    rows, width = page_table.shape
    limit = lengths.long().clamp(0, width * PAGE).clamp(max=max(int(active_width[0]), 0))
    pages = kcache.shape[0]
    kq = kcache[:, :8192].contiguous().view(torch.float8_e4m3fn).reshape(pages, PAGE, 128)
    ks = kcache[:, 8192:PAGE_BYTES].contiguous().view(torch.float32).reshape(pages, PAGE)
    logits = torch.full((rows, width * PAGE), -math.inf, device=q.device)
    cand = torch.zeros((rows, width * PAGE), dtype=torch.bool, device=q.device)
    qf, wf = q.float(), w.float()
    for r in range(rows):
        n = int(limit[r])
        cols = -(-n // PAGE)
        if cols == 0:
            continue
        pids = page_table[r, :cols].long()
        k = kq[pids.clamp(min=0)].float().reshape(cols * PAGE, 128)
        s = ks[pids.clamp(min=0)].reshape(-1)
        row = (torch.relu(qf[r] @ k.T) * wf[r, :, None]).sum(0) * s
        mapped = (pids >= 0).repeat_interleave(PAGE)
        ok = mapped & (torch.arange(cols * PAGE, device=q.device) < n)
        logits[r, : cols * PAGE] = torch.where(ok, row, -math.inf)
        cand[r, : cols * PAGE] = ok
    return logits, cand


def ref_select(logits, cand, topk):
    """Positions of the reference top-k per row (order: value desc, NaN lowest,
    -0 == +0, ties to the lower position; non-candidates never)."""
    x = logits + 0.0
    bits = x.view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(bits >= 0x80000000, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    key = torch.where(torch.isnan(x), torch.zeros_like(key), key)
    pos = torch.arange(x.shape[1], device=x.device)
    comp = key * (1 << 31) + ((1 << 31) - 1 - pos)
    comp = torch.where(cand, comp, torch.full_like(comp, -1))
    k = min(topk, x.shape[1])
    top = torch.topk(comp, k, dim=1).indices
    return top, cand.sum(1)


def to_logical(indices, page_table):
    """Physical pid*64+slot back to logical positions (unique pids per row)."""
    out = torch.full_like(indices, -1)
    for r in range(indices.shape[0]):
        inv = {int(p): c for c, p in enumerate(page_table[r].tolist()) if p >= 0}
        vals = indices[r].tolist()
        out[r] = torch.tensor(
            [inv[v // PAGE] * PAGE + v % PAGE if v >= 0 else -1 for v in vals],
            dtype=indices.dtype,
        )
    return out


def assert_topk_ok(idx, scores, logits, cand, topk, *, tie_tol=1e-3, score_atol=1e-2):
    idx, logits, cand = idx.cpu().long(), logits.cpu(), cand.cpu()
    ref, n_cand = ref_select(logits, cand, topk)
    for r in range(idx.shape[0]):
        n = min(topk, int(n_cand[r]))
        row = idx[r]
        assert int((row[:n] >= 0).sum()) == n and bool((row[n:] == -1).all()), (
            f"row {r}: expected {n} indices then -1s, got {int((row >= 0).sum())} valid"
        )
        got = row[:n]
        assert int(torch.unique(got).numel()) == n, f"row {r}: duplicate indices"
        assert bool(cand[r, got].all()), f"row {r}: a non-candidate was selected"
        if n:
            want = ref[r, :n]
            boundary = float(logits[r, want[-1]])
            diff = set(got.tolist()) ^ set(want.tolist())
            far = [
                t
                for t in diff
                if not abs(float(logits[r, t]) - boundary) <= tie_tol * (1 + abs(boundary))
            ]
            assert not far, f"row {r}: differs beyond near-ties at {far[:8]} (boundary {boundary})"
        if scores is not None:
            s = scores[r].cpu()
            expect = logits[r, got]
            assert torch.allclose(s[:n], expect, atol=score_atol, rtol=1e-4, equal_nan=True), (
                f"row {r}: scores differ from the reference logits"
            )
            assert bool((s[n:] == -math.inf).all()), f"row {r}: padding scores must be -inf"


# ------------------------------------------------------------------ fixtures


def make_case(
    rows,
    heads,
    width,
    lengths,
    *,
    pages=None,
    page_stride=PAGE_BYTES,
    pid_offset=0,
    unmapped=(),
    seed=0,
    shared=False,
):
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev = "cuda"
    q = (torch.randn(rows, heads, 128, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, device=dev, generator=g) * heads**-0.5
    table_rows = 1 if shared else rows
    n_pages = pages if pages is not None else table_rows * width + pid_offset
    used = torch.randperm(table_rows * width, device=dev, generator=g) + pid_offset
    page_table = used.reshape(table_rows, width).int()
    for r, c in unmapped:
        page_table[r, c] = -1
    k = (torch.randn(n_pages - pid_offset, PAGE, 128, device=dev, generator=g) * 2).to(
        torch.float8_e4m3fn
    )
    scales = torch.rand(n_pages - pid_offset, PAGE, device=dev, generator=g) + 0.05
    kcache = torch.zeros((n_pages, page_stride), dtype=torch.uint8, device=dev)
    kcache[pid_offset:, :8192] = k.view(torch.uint8).reshape(-1, 8192)
    kcache[pid_offset:, 8192:PAGE_BYTES] = scales.view(torch.uint8).reshape(-1, 256)
    kcache = kcache[:, :PAGE_BYTES]
    lens = torch.tensor(lengths, dtype=torch.int32, device=dev)
    aw = torch.tensor([max([*lengths, 0])], dtype=torch.int32, device=dev)
    return q, w, kcache, page_table, lens, aw


def run_raw(
    case, topk, *, supertile, slices=1, prefill=False, physical=False, table=None, flavor=0
):
    from b12x import _indexer_raw, cuda

    q, w, kcache, page_table, lens, aw = case
    table = page_table if table is None else table
    cuda.load_kernels(q.get_device())
    plan = _indexer_raw.RawPlan(
        rows_cap=q.shape[0],
        heads=q.shape[1],
        width=table.shape[1],
        topk=topk,
        supertile=supertile,
        slices=slices,
        prefill=prefill,
        physical=physical,
        flavor=flavor,
    )
    scratch = torch.full((plan.scratch_bytes,), 0xAB, dtype=torch.uint8, device="cuda")
    idx = torch.full((q.shape[0], topk), 12345, dtype=torch.int32, device="cuda")
    sc = torch.full((q.shape[0], topk), 7.0, device="cuda")
    _indexer_raw.launch(plan, scratch, q, w, kcache, table, lens, aw, idx, sc)
    torch.cuda.synchronize()
    return idx, sc


def check(case, topk, idx, sc, *, table=None, physical=False):
    q, w, kcache, page_table, lens, aw = case
    table = page_table if table is None else table
    full = table.expand(q.shape[0], -1) if table.shape[0] == 1 else table
    logits, cand = ref_logits(q, w, kcache, full, lens, aw)
    if physical:
        idx = to_logical(idx.cpu(), full.cpu())
    assert_topk_ok(idx, sc, logits, cand, topk)


@pytest.fixture(autouse=True)
def _exact_fp32_matmul():
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = old


# ------------------------------------------------------------------ tests


@pytest.mark.parametrize("heads", [16, 32, 64])
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_decode_grid(heads, topk):
    width = 48  # 3072 tokens: 3 chunks of 1024
    lengths = [0, topk // 2 + 3, width * PAGE - 37, 2000, 64, width * PAGE]
    case = make_case(len(lengths), heads, width, lengths, seed=heads + topk)
    idx, sc = run_raw(case, topk, supertile=1024)
    check(case, topk, idx, sc)


@pytest.mark.parametrize("heads", [16, 48, 64])
def test_decode_single_chunk_and_default_supertile(heads):
    lengths = [5000, 777, 12000]
    case = make_case(3, heads, 200, lengths, seed=3)
    idx, sc = run_raw(case, 512, supertile=12800)
    check(case, 512, idx, sc)


@pytest.mark.parametrize("heads", [16, 48, 64])
def test_both_mma_flavors(heads):
    # e4m3 mma (native on sm_89/sm_120; emulated by the driver on sm_90) and
    # the f16 flavor, on decode and shared-table prefill.
    width, rows = 30, 70
    lengths = [width * PAGE - 3 - i for i in range(rows)]
    lengths[0] = 0
    case = make_case(rows, heads, width, lengths, seed=heads + 1)
    shared = make_case(rows, heads, width, lengths, seed=heads + 2, shared=True)
    table = shared[3].expand(rows, width)
    for flavor in (1, 2):
        idx, sc = run_raw(case, 512, supertile=1024, flavor=flavor)
        check(case, 512, idx, sc)
        idx, sc = run_raw(shared, 512, supertile=1024, prefill=True, table=table, flavor=flavor)
        check(shared, 512, idx, sc, table=table)


def test_unmapped_pages_are_not_candidates():
    width = 40
    lengths = [width * PAGE, 1500, 700]
    unmapped = [(0, 3), (0, 17), (0, 39), (1, 0), (1, 5), (2, 2), (2, 10)]
    case = make_case(3, 64, width, lengths, unmapped=unmapped, seed=5)
    for topk in (512, 1024):
        idx, sc = run_raw(case, topk, supertile=1024)
        check(case, topk, idx, sc)


def test_padded_stride_and_page_ids_past_2_31_bytes():
    # 1 MiB + 16 B pages: page ids >= 2048 start past byte 2^31.
    stride = (1 << 20) + 16
    width = 24
    lengths = [width * PAGE, 1000]
    case = make_case(2, 32, width, lengths, page_stride=stride, pid_offset=2048, seed=7)
    assert int(case[3].min()) * stride > 2**31
    idx, sc = run_raw(case, 512, supertile=512)
    check(case, 512, idx, sc)


@pytest.mark.parametrize("heads", [32, 64])
def test_shared_prefill_matches_expanded_table(heads):
    rows, width = 96, 40
    top = width * PAGE - 11
    lengths = [top - rows + 1 + i for i in range(rows)]
    lengths[5] = 0
    lengths[6] = 300
    case = make_case(rows, heads, width, lengths, shared=True, unmapped=[(0, 7)], seed=11)
    shared = case[3].expand(rows, width)
    assert shared.stride(0) == 0
    idx_p, sc_p = run_raw(case, 512, supertile=1024, prefill=True, table=shared)
    check(case, 512, idx_p, sc_p, table=shared)
    expanded = shared.contiguous()
    idx_d, sc_d = run_raw(case, 512, supertile=1024, table=expanded)
    check(case, 512, idx_d, sc_d, table=expanded)
    # the same selected sets, row by row (both are exact selections of close logits)
    same = sum(
        set(a.tolist()) == set(b.tolist()) for a, b in zip(idx_p.cpu(), idx_d.cpu(), strict=True)
    )
    assert same >= rows - 2


def test_physical_output():
    width = 32
    lengths = [width * PAGE, 900, 0]
    case = make_case(3, 64, width, lengths, unmapped=[(1, 4)], seed=13)
    idx, sc = run_raw(case, 1024, supertile=1024, physical=True)
    check(case, 1024, idx, sc, physical=True)
    # physical ids are pid * 64 + slot of pages in the row's table
    r0 = idx[0].cpu()
    assert bool((r0 // PAGE).unsqueeze(1).eq(case[3][0].cpu().unsqueeze(0)).any(1).all())


@pytest.mark.parametrize("slices", [2, 8])
def test_two_stage_topk(slices):
    width = 128
    lengths = [width * PAGE, 5000, 300, width * PAGE - 100]
    case = make_case(4, 64, width, lengths, unmapped=[(1, 9)], seed=17)
    for topk in (512, 2048):
        idx, sc = run_raw(case, topk, supertile=4096, slices=slices)
        check(case, topk, idx, sc)


def test_exact_ties_pick_the_lowest_positions():
    # Every token of every page is the same row of K with the same scale:
    # all logits are bit-identical, so the selection is positions 0..k-1.
    rows, width = 2, 40
    case = make_case(rows, 64, width, [width * PAGE, 1500], seed=19)
    _q, _w, kcache, _page_table, _lens, _aw = case
    kcache[:, :8192] = kcache[0, :128].repeat(64)
    kcache[:, 8192:PAGE_BYTES] = kcache[0, 8192:8196].repeat(64)
    for slices in (1, 4):
        idx, _ = run_raw(case, 512, supertile=2048, slices=slices)
        for r in range(rows):
            assert sorted(idx[r].tolist()) == list(range(512))


def test_negative_weights_tie_at_zero_and_nan_is_last():
    rows, width = 2, 24
    case = make_case(rows, 16, width, [width * PAGE, 1000], seed=23)
    _q, w, kcache, page_table, _lens, _aw = case
    w.copy_(-w.abs())  # every logit <= 0, many exactly 0 (relu)
    # NaN scales on the first page of row 0: those logits are NaN
    pid = int(page_table[0, 0])
    kcache[pid, 8192:PAGE_BYTES] = torch.full((64,), float("nan"), device="cuda").view(torch.uint8)
    idx, sc = run_raw(case, 512, supertile=512)
    check(case, 512, idx, sc)
    assert not bool(torch.isnan(sc[0]).any())


def test_graph_replay_with_rewritten_metadata():
    from b12x import _indexer_raw, cuda

    rows, width, topk = 4, 64, 512
    case = make_case(rows, 64, width, [2000, 4096, 0, 600], pages=rows * width + 8, seed=29)
    q, w, kcache, page_table, lens, aw = case
    cuda.load_kernels(0)
    plan = _indexer_raw.RawPlan(
        rows_cap=rows, heads=64, width=width, topk=topk, supertile=1024, slices=2
    )
    scratch = torch.empty((plan.scratch_bytes,), dtype=torch.uint8, device="cuda")
    idx = torch.empty((rows, topk), dtype=torch.int32, device="cuda")
    sc = torch.empty((rows, topk), device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _indexer_raw.launch(plan, scratch, q, w, kcache, page_table, lens, aw, idx, sc)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _indexer_raw.launch(plan, scratch, q, w, kcache, page_table, lens, aw, idx, sc)
    graph.replay()
    torch.cuda.synchronize()
    check(case, topk, idx, sc)
    # rewrite the table (including spare pages), lengths and active_width in place
    g = torch.Generator(device="cuda").manual_seed(31)
    page_table.copy_(
        torch.randperm(rows * width + 8, device="cuda", generator=g)[: rows * width]
        .reshape(rows, width)
        .int()
    )
    lens.copy_(torch.tensor([width * PAGE, 100, 3000, 0], dtype=torch.int32))
    aw.fill_(width * PAGE)
    idx.fill_(-7)
    sc.fill_(3.0)
    graph.replay()
    torch.cuda.synchronize()
    check(case, topk, idx, sc)
