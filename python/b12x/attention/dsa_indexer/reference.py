"""Pure-PyTorch semantics of the C4 indexer; the GPU kernels are tested against it.

Cache pages (planar, 8448 bytes each; the page stride may be larger):
bytes ``[0, 8192)`` hold 64 rows x 128 FP8-e4m3 values (row ``s`` at ``s*128``),
bytes ``[8192, 8448)`` hold 64 little-endian float32 scales (row ``s`` at
``8192 + 4*s``).

For query row ``r`` and logical position ``t`` (``page_col = t // 64``,
``slot = t % 64``, ``pid = page_table[r, page_col]``)::

    limit(r)     = clamp(min(cache_lengths[r], active_width), 0, width * 64)
    candidate    = t < limit(r) and 0 <= pid < pages
    logit(r, t)  = scale[pid, slot] * sum_h w[r, h] * relu(q[r, h, :] . k[pid, slot, :])

with the dot product over the raw e4m3 values in float32 (the K scale is
applied after the ReLU). ``active_width`` is an upper bound on the lengths
that lets kernels skip work; a row never looks past it.

Page ids: ``-1`` (any negative id) marks an unmapped page. An id at or past
``pages = index_k_cache.shape[0]`` is treated the same way (its page is never
read, its tokens are never candidates) and is a caller error: ``run`` records
the first one it meets inside a row's live length (:func:`first_page_fault`),
and ``Binding.check()`` / ``dsa_indexer.check()`` raise it as
:class:`b12x.errors.PageTableError`. Entries past a row's live length are
never read, whatever they hold.

Selection: the ``min(topk, candidates)`` best candidates under one total
order, so the selected *set* is deterministic:

1. larger value first, with ``-0.0 == +0.0``;
2. NaN below every number (-inf included): a NaN is only selected when
   there are not enough numbers;
3. among equal values, the lower logical position first.

The GPU radix key that realises this order is :func:`order_keys` (an
order-preserving unsigned 32-bit key; NaN -> 0, non-candidates -> -1).
Output rows hold the selected entries first (the reference lists them in
selection order; kernels may use any order) and then a tail of ``-1``
indices with ``-inf`` scores. Indices are logical positions ``t``, or
``pid * 64 + slot`` in the physical index space. ``scores[r, j]`` is the logit
of ``indices[r, j]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from b12x import _core
from b12x.errors import ConfigError, ShapeError

__all__ = [
    "assert_topk_equivalent",
    "candidate_limits",
    "candidate_mask",
    "first_page_fault",
    "indexer_topk",
    "order_keys",
    "pack_index_k_cache",
    "paged_logits",
    "quantize_index_k",
    "run_binding",
    "select_topk",
    "select_topk_chunked",
    "to_physical",
    "unpack_index_k_cache",
]

PAGE_SIZE: int = _core.INDEXER_PAGE_SIZE
HEAD_DIM: int = _core.INDEXER_HEAD_DIM
PAGE_BYTES: int = _core.INDEXER_PAGE_BYTES
SCALE_OFFSET: int = _core.INDEXER_SCALE_OFFSET
FP8_MAX = 448.0
_U32 = 0xFFFFFFFF


# --- the cache page packer -------------------------------------------------------------


def quantize_index_k(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row FP8 quantization of K ``[pages, 64, 128]``: ``scale = amax / 448``
    (1.0 for an all-zero row). Returns ``(k_fp8, scales[pages, 64] float32)``."""
    k = k.float()
    amax = k.abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    k_fp8 = (k / scales[..., None]).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return k_fp8, scales


def pack_index_k_cache(
    k_fp8: torch.Tensor, scales: torch.Tensor, *, page_stride: int = PAGE_BYTES
) -> torch.Tensor:
    """Packs ``k_fp8 [pages, 64, 128]`` (float8_e4m3fn, or values rounded to it)
    and ``scales [pages, 64]`` into planar pages.

    Returns a uint8 ``[pages, 8448]`` view whose page stride is ``page_stride``
    bytes (>= 8448; the padding bytes are zero), as the kernels read it.
    """
    op = "pack_index_k_cache"
    if page_stride < PAGE_BYTES:
        raise ConfigError(f"{op}: page_stride expected >= {PAGE_BYTES}, got {page_stride}")
    pages = k_fp8.shape[0]
    if tuple(k_fp8.shape) != (pages, PAGE_SIZE, HEAD_DIM):
        raise ShapeError(
            f"{op}: k_fp8 expected shape ({pages}, {PAGE_SIZE}, {HEAD_DIM}), "
            f"got {tuple(k_fp8.shape)}"
        )
    if tuple(scales.shape) != (pages, PAGE_SIZE):
        raise ShapeError(
            f"{op}: scales expected shape ({pages}, {PAGE_SIZE}), got {tuple(scales.shape)}"
        )
    if k_fp8.dtype != torch.float8_e4m3fn:
        k_fp8 = k_fp8.to(torch.float8_e4m3fn)
    buf = torch.zeros((pages, page_stride), dtype=torch.uint8, device=k_fp8.device)
    buf[:, :SCALE_OFFSET] = k_fp8.contiguous().view(torch.uint8).reshape(pages, SCALE_OFFSET)
    buf[:, SCALE_OFFSET:PAGE_BYTES] = (
        scales.float().contiguous().view(torch.uint8).reshape(pages, PAGE_SIZE * 4)
    )
    return buf[:, :PAGE_BYTES]


def unpack_index_k_cache(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse of :func:`pack_index_k_cache` for ``[pages, 8448]`` uint8 of any page
    stride: ``(k_fp8 [pages, 64, 128] float8_e4m3fn, scales [pages, 64] float32)``."""
    pages = cache.shape[0]
    k = cache[:, :SCALE_OFFSET].contiguous().view(torch.float8_e4m3fn)
    s = cache[:, SCALE_OFFSET:PAGE_BYTES].contiguous().view(torch.float32)
    return k.reshape(pages, PAGE_SIZE, HEAD_DIM), s.reshape(pages, PAGE_SIZE)


# --- logits ------------------------------------------------------------------------------


def _active_width(active_width: Any) -> int | None:
    if active_width is None:
        return None
    if isinstance(active_width, torch.Tensor):
        return int(active_width.reshape(-1)[0])
    return int(active_width)


def candidate_limits(
    page_table: torch.Tensor, cache_lengths: torch.Tensor, active_width: Any = None
) -> torch.Tensor:
    """``limit(r) = clamp(min(len_r, active_width), 0, width * 64)`` as int64 ``[rows]``."""
    width = page_table.shape[1]
    n = cache_lengths.long().clamp(0, width * PAGE_SIZE)
    aw = _active_width(active_width)
    if aw is not None:
        n = n.clamp(max=max(aw, 0))
    return n


def candidate_mask(
    page_table: torch.Tensor,
    cache_lengths: torch.Tensor,
    active_width: Any = None,
    *,
    pages: int | None = None,
) -> torch.Tensor:
    """Bool ``[rows, width * 64]``: position ``t`` is below the row's limit and on a
    mapped page (page id >= 0, and < ``pages`` when given: the cache's page count)."""
    width = page_table.shape[1]
    n = candidate_limits(page_table, cache_lengths, active_width)
    t = torch.arange(width * PAGE_SIZE, device=page_table.device)
    below = t[None, :] < n[:, None].to(page_table.device)
    pid = page_table.long()
    ok = pid >= 0 if pages is None else (pid >= 0) & (pid < pages)
    return below & ok.repeat_interleave(PAGE_SIZE, dim=1)


def first_page_fault(
    page_table: torch.Tensor, cache_lengths: torch.Tensor, active_width: Any, pages: int
) -> tuple[int, int, int] | None:
    """The first ``(row, column, page_id)`` in row-major order whose page id is at or
    past ``pages`` inside the row's live length, or None. Such ids are unmapped; the
    GPU kernels report one of them (the first to arrive) the same way."""
    limits = candidate_limits(page_table, cache_lengths, active_width)
    cols = (limits + PAGE_SIZE - 1) // PAGE_SIZE
    c = torch.arange(page_table.shape[1], device=page_table.device)
    live = c[None, :] < cols[:, None].to(page_table.device)
    bad = (page_table.long() >= pages) & live
    if not bool(bad.any()):
        return None
    row, col = (int(v) for v in torch.nonzero(bad)[0])
    return row, col, int(page_table[row, col])


def paged_logits(
    q_fp8: torch.Tensor,
    query_weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_lengths: torch.Tensor,
    active_width: Any = None,
) -> torch.Tensor:
    """Float32 ``[rows, width * 64]`` logits; ``-inf`` where not a candidate.

    Reads only the pages each row can see; a page id at or past the cache's
    page count is unmapped, like -1 (see the module docstring).
    """
    rows, heads, _ = q_fp8.shape
    width = page_table.shape[1]
    pages = index_k_cache.shape[0]
    mask = candidate_mask(page_table, cache_lengths, active_width, pages=pages)
    limits = candidate_limits(page_table, cache_lengths, active_width).tolist()
    logits = torch.full((rows, width * PAGE_SIZE), -math.inf, device=q_fp8.device)
    q = q_fp8.float()
    w = query_weights.reshape(rows, heads).float()
    for r in range(rows):
        cols = -(-limits[r] // PAGE_SIZE)
        if cols == 0 or pages == 0:  # nothing to read (a cache without pages maps none)
            continue
        pids = page_table[r, :cols].long()
        # unmapped pages (masked below) read page 0 instead of nothing
        pids = torch.where((pids >= 0) & (pids < pages), pids, 0)
        k_fp8, scales = unpack_index_k_cache(index_k_cache[pids])
        k = k_fp8.float().reshape(cols * PAGE_SIZE, HEAD_DIM)
        dots = q[r] @ k.T  # [heads, cols*64], float32
        row = (torch.relu(dots) * w[r, :, None]).sum(dim=0) * scales.reshape(-1)
        span = slice(0, cols * PAGE_SIZE)
        logits[r, span] = torch.where(mask[r, span], row, -math.inf)
    return logits


# --- selection ---------------------------------------------------------------------------


def order_keys(logits: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Int64 keys whose descending order is the selection order (ties aside).

    Numbers map to the order-preserving u32 key of ``x + 0.0`` (so -0.0 and
    +0.0 share a key): ``bits ^ 0xFFFFFFFF`` for negatives, ``bits | 0x80000000``
    otherwise. NaN maps to 0, below -inf's key 0x007FFFFF; non-candidates to -1.
    """
    x = logits.float() + 0.0
    bits = x.view(torch.int32).long() & _U32
    key = torch.where(bits >= 0x80000000, bits ^ _U32, bits | 0x80000000)
    key = torch.where(torch.isnan(x), torch.zeros_like(key), key)
    return torch.where(candidates, key, torch.full_like(key, -1))


def _emit(
    logits: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    rows, k = positions.shape
    ok = keys >= 0
    idx = torch.full((rows, topk), -1, dtype=torch.int32, device=logits.device)
    scores = torch.full((rows, topk), -math.inf, dtype=torch.float32, device=logits.device)
    idx[:, :k] = torch.where(ok, positions, -1).int()
    gathered = logits.float().gather(1, positions.clamp(min=0))
    scores[:, :k] = torch.where(ok, gathered, -math.inf)
    return idx, scores


def _sort_desc(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # ascending stable sort of -key: equal keys keep their input order
    neg, order = torch.sort(-keys, dim=1, stable=True)
    return -neg, order


def select_topk(
    logits: torch.Tensor, candidates: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of every row in logical positions: ``(indices int32, scores float32)``,
    ``[rows, topk]``, selected entries first in selection order, then -1 / -inf."""
    keys, order = _sort_desc(order_keys(logits, candidates))
    k = min(topk, logits.shape[1])
    return _emit(logits, order[:, :k], keys[:, :k], topk)


def select_topk_chunked(
    logits: torch.Tensor, candidates: torch.Tensor, topk: int, chunk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same selection computed the way the kernels do: chunk by chunk,
    folding each chunk into a carried top-k. Equal to :func:`select_topk`
    because the order is total (ties broken by position)."""
    rows, n = logits.shape
    keys = order_keys(logits, candidates)
    carry = torch.empty((rows, 0), dtype=torch.long, device=logits.device)
    carry_keys = torch.empty((rows, 0), dtype=torch.long, device=logits.device)
    for start in range(0, n, chunk):
        pos = torch.arange(start, min(start + chunk, n), device=logits.device).expand(rows, -1)
        # carried positions precede the chunk's, so a stable sort keeps ties by position
        cand = torch.cat([carry, pos], dim=1)
        cand_keys = torch.cat([carry_keys, keys[:, start : start + chunk]], dim=1)
        sorted_keys, order = _sort_desc(cand_keys)
        carry = cand.gather(1, order[:, :topk])
        carry_keys = sorted_keys[:, :topk]
    return _emit(logits, carry, carry_keys, topk)


def to_physical(indices: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
    """Logical indices -> ``page_id * 64 + slot`` (-1 stays -1)."""
    valid = indices >= 0
    t = indices.long().clamp(min=0)
    pid = page_table.long().gather(1, t // PAGE_SIZE)
    phys = pid * PAGE_SIZE + t % PAGE_SIZE
    return torch.where(valid & (pid >= 0), phys, -1).int()


def indexer_topk(
    q_fp8: torch.Tensor,
    query_weights: torch.Tensor,
    index_k_cache: torch.Tensor,
    page_table: torch.Tensor,
    cache_lengths: torch.Tensor,
    active_width: Any,
    topk: int,
    *,
    index_space: str = "logical",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole op: ``(indices int32 [rows, topk], scores float32 [rows, topk])``."""
    if index_space not in ("logical", "physical"):
        raise ConfigError(
            f"indexer_topk: index_space expected 'logical' or 'physical', got {index_space!r}"
        )
    logits = paged_logits(
        q_fp8, query_weights, index_k_cache, page_table, cache_lengths, active_width
    )
    pages = index_k_cache.shape[0]
    mask = candidate_mask(page_table, cache_lengths, active_width, pages=pages)
    idx, scores = select_topk(logits, mask, topk)
    if index_space == "physical":
        idx = to_physical(idx, page_table)
    return idx, scores


def run_binding(binding: Any) -> tuple[int, int, int] | None:
    """``dsa_indexer.run`` for CPU bindings: computes and writes every output slot.

    Returns :func:`first_page_fault` of the call (``run`` records it for ``check``).
    """
    plan = binding.plan
    idx, scores = indexer_topk(
        binding.q_fp8,
        binding.query_weights,
        binding.index_k_cache,
        binding.page_table,
        binding.cache_lengths,
        binding.active_width,
        plan.topk,
        index_space=plan.output_index_space,
    )
    binding.output_indices.copy_(idx)
    if binding.output_scores is not None:
        binding.output_scores.copy_(scores)
    pages = binding.index_k_cache.shape[0]
    return first_page_fault(binding.page_table, binding.cache_lengths, binding.active_width, pages)


# --- comparing a result against the reference --------------------------------------------


def _physical_to_logical(
    pos: torch.Tensor, table_row: torch.Tensor, cand_row: torch.Tensor
) -> torch.Tensor:
    """Logical positions of physical indices (-1 where no candidate matches)."""
    width = table_row.shape[0]
    pid, slot = pos // PAGE_SIZE, pos % PAGE_SIZE
    match = table_row.long()[None, :] == pid[:, None]  # [n, width]
    visible = cand_row.reshape(width, PAGE_SIZE)[:, slot].T  # [n, width]
    ok = match & visible
    col = ok.int().argmax(dim=1)
    return torch.where(ok.any(dim=1), col * PAGE_SIZE + slot, -1)


def _near(v: float, b: float, atol: float, rtol: float) -> bool:
    if math.isnan(v) or math.isnan(b):
        return math.isnan(v) and math.isnan(b)
    return v == b or abs(v - b) <= atol + rtol * abs(b)


def assert_topk_equivalent(
    indices: torch.Tensor,
    scores: torch.Tensor | None,
    ref_logits: torch.Tensor,
    candidates: torch.Tensor,
    topk: int,
    *,
    page_table: torch.Tensor | None = None,
    index_space: str = "logical",
    score_atol: float = 1e-2,
    score_rtol: float = 0.0,
    tie_atol: float = 1e-3,
    tie_rtol: float = 1e-3,
) -> None:
    """Asserts that a top-k result matches the reference up to near-ties.

    Per row, with ``n = min(topk, candidates in the row)``: the first ``n``
    indices are distinct candidates (physical ones mapped back through
    ``page_table``) and the rest are -1; the index set equals the reference
    set except for elements whose reference logit is within
    ``tie_atol + tie_rtol * |boundary|`` of the n-th reference value (the
    order in a row is free); ``scores`` match the reference logits of their
    indices and are -inf in the padding.

    ``ref_logits`` and ``candidates`` come from :func:`paged_logits` and
    :func:`candidate_mask`; ``page_table`` is needed for physical indices.
    """
    if index_space == "physical" and page_table is None:
        raise ConfigError(
            "assert_topk_equivalent: page_table expected a tensor for physical indices "
            "(to map them back to logical positions), got None"
        )
    idx = indices.detach().cpu().long()
    logits = ref_logits.detach().cpu().float()
    cand = candidates.detach().cpu()
    table = page_table.detach().cpu() if page_table is not None else None
    got_scores = scores.detach().cpu().float() if scores is not None else None
    ref_idx, _ = select_topk(logits, cand, topk)
    if tuple(idx.shape) != (logits.shape[0], topk):
        raise AssertionError(f"indices expected shape {(logits.shape[0], topk)}, got {idx.shape}")
    for r in range(idx.shape[0]):
        n = min(topk, int(cand[r].sum()))
        row = idx[r]
        if bool((row[:n] < 0).any()) or bool((row[n:] != -1).any()):
            raise AssertionError(
                f"row {r}: expected {n} indices >= 0 then {topk - n} x -1, got "
                f"{int((row >= 0).sum())} non-negative: {row.tolist()[: min(topk, 32)]}..."
            )
        pos = row[:n]
        if index_space == "physical":
            assert table is not None
            logical = _physical_to_logical(pos, table[r], cand[r])
            if bool((logical < 0).any()):
                bad = pos[logical < 0].tolist()[:8]
                raise AssertionError(f"row {r}: physical indices {bad} are not candidates")
            pos = logical
        if int(torch.unique(pos).numel()) != n:
            raise AssertionError(f"row {r}: duplicate indices among {n}")
        if not bool(cand[r, pos].all()):
            bad = pos[~cand[r, pos]].tolist()[:8]
            raise AssertionError(f"row {r}: indices {bad} are not candidates")
        if n:
            ref = ref_idx[r, :n].long()
            boundary = float(logits[r, ref[-1]])
            diff = set(pos.tolist()) ^ set(ref.tolist())
            far = [
                t
                for t in sorted(diff)
                if not _near(float(logits[r, t]), boundary, tie_atol, tie_rtol)
            ]
            if far:
                vals = [float(logits[r, t]) for t in far[:8]]
                raise AssertionError(
                    f"row {r}: selection differs from the reference beyond near-ties "
                    f"(boundary {boundary}): positions {far[:8]} with logits {vals}"
                )
        if got_scores is not None:
            s = got_scores[r]
            expect = logits[r, pos]
            if not torch.allclose(s[:n], expect, atol=score_atol, rtol=score_rtol, equal_nan=True):
                worst = (s[:n] - expect).abs().nan_to_num(nan=math.inf).argmax()
                raise AssertionError(
                    f"row {r}: score {float(s[worst])} of index {int(pos[worst])} differs from "
                    f"the reference logit {float(expect[worst])}"
                )
            if bool((s[n:] != -math.inf).any()):
                raise AssertionError(f"row {r}: padding scores expected -inf")
