"""The planned C4 sparse indexer: paged FP8 scoring, then exact top-k.

Lifecycle (names are drop-in for the vLLM adapter)::

    caps = Caps(device="cuda:0", num_q_heads=64, max_q_rows=64,
                max_page_table_width=1024, topk=512, mode="decode")
    p = plan(caps)                       # interned: plan(caps) is plan(caps)
    scratch = torch.empty(p.nbytes, dtype=torch.uint8, device=caps.device)
    b = bind(p, scratch=scratch, q_fp8=q, query_weights=w,
             index_k_cache=cache, page_table=table, cache_lengths=lens,
             active_width=aw, output_indices=out, output_scores=scores)
    run(b)                               # writes every slot of out (and scores)
    b.check()                            # debugging: syncs, raises PageTableError

* :func:`plan` is host work only (on a CUDA device its first call loads the
  kernels there). A plan holds no tensors and no addresses.
* :func:`bind` checks every operand against the plan and never allocates,
  launches or syncs; the scratch and output bytes are left untouched. It
  takes torch tensors (wrap another DLPack producer with ``torch.from_dlpack``,
  which shares its memory), and what the kernels write (the scratch's first
  ``plan.nbytes`` bytes, the outputs) must share no byte with any input or
  with each other: an overlap is a ``ConfigError`` naming both operands.
* :func:`run` enqueues device work only, so it can be captured in a CUDA graph.
* :meth:`Binding.check` / :func:`check` (debugging, off the hot path) sync the
  device and raise :class:`b12x.errors.PageTableError` for a page id past the
  K cache that a run met.

Bucketed capacities
-------------------
A plan's ``max_q_rows`` and ``max_page_table_width`` are the caps' values
rounded up: exact up to 8, then the next m·2^k with m in {4, 5, 6, 7}
(8, 10, 12, 14, 16, 20, 24, ...). A capacity is at most 25% above the request,
powers of two stay exact (the vLLM profile width ceil(65536/64) = 1024 is its
own bucket), a plan for capacity C serves every call <= C, and varying
prefill chunk sizes create O(log) plans, not one per size. ``Caps`` keeps what
the caller passed; ``Plan.caps`` / ``Plan.max_q_rows`` report the capacities.

Scratch
-------
One caller-owned uint8 buffer of at least ``plan.nbytes`` bytes
(``plan.scratch_specs()``, ``plan.shapes_and_dtypes()``), on the plan's device,
contiguous and 16-byte aligned; a larger one is fine. ``bind`` takes it as a
tensor, a mapping ``{"paged_indexer.scratch": tensor}`` or a one-element
sequence. Its regions (``plan.layout``) start on 1024-byte boundaries. Its
contents need no initialisation: ``run`` initialises what it uses.

Precision
---------
``Caps(precision="exact")`` (the default): fp32 accumulation of exact FP8
products, the same logits on every architecture, deterministic ties.
``precision="fast"`` lets a device use a faster MMA with reduced-precision
accumulation; on Hopper (sm_90) that is FP8 wgmma. Its contract: every logit
within 1e-3 of the fp32 reference relative to its magnitude
``scale * sum_h |w_h| * |q_h . k|`` (which is ``|logit|`` when no term is
negative), and the selected set equal to the reference's except for indices
whose logit lies within that tolerance of the k-th value. Where the hardware
has no faster path, "fast" is exact. ``Plan.mma_flavor`` (and the plan's
repr) says which flavor runs: "e4m3", "f16", "wgmma", "tma_f16" (the exact one
on Hopper: f16 wgmma scorers fed by TMA), "wgmma_fp8", "tma_fp8" (the fast one on
Hopper: the FP8 wgmma scorers fed by TMA) or "reference" (CPU).

Page ids
--------
``page_table`` holds page ids of ``index_k_cache`` (its rows); ``-1`` (any
negative id) is an unmapped page. Entries past a row's live length are never
read. An id at or past ``index_k_cache.shape[0]`` is a caller error that the
kernels contain: they bound every id by the bound cache's page count, treat
such a page as unmapped (never read, never a candidate) and record the first
one (row, column, id) in a per-device status word that runs never clear.
Reading it needs a sync, so it is not read in ``run``: call ``Binding.check()``
or :func:`check` where a sync is acceptable; it raises ``PageTableError``
naming the entry and clears the record. CPU runs follow the same rule.
Physical indices ``page_id * 64 + slot`` are computed in 64 bits; ``bind``
refuses a physical-output call whose cache has more than 2^25 pages (the
indices would not fit int32).

Routes
------
``plan.route`` (also on ``plan.layout`` and on a binding) is ``"paged_decode"``
for decode plans and ``"packed_contiguous"`` for prefill plans. The prefill
name is the one vLLM's b12x adapters assert; the kernel does not pack K into
a contiguous buffer: every query row reads its request's page-table row in
place (a stride-0 table) and the scorer tiles rows x 512 tokens as a GEMM.

Semantics
---------
:mod:`b12x.attention.dsa_indexer.reference` defines the result, including the
deterministic order (lowest logical index wins ties, NaN below every number).
"""

from __future__ import annotations

from typing import Any

from b12x import _core
from b12x.attention.dsa_indexer import reference

__all__ = [
    "INDEX_HEAD_DIM",
    "INDEX_PAGE_BYTES",
    "PAGED_INDEX_PAGE_SIZE",
    "SCRATCH_NAME",
    "SUPPORTED_TOPK",
    "Binding",
    "Caps",
    "Plan",
    "ScratchLayout",
    "ScratchRegion",
    "ScratchSpec",
    "bind",
    "cached_plan_count",
    "check",
    "clear_caches",
    "is_supported",
    "plan",
    "reference",
    "run",
    "scratch_views",
]

#: Compressed K rows per page of the index cache.
PAGED_INDEX_PAGE_SIZE: int = _core.INDEXER_PAGE_SIZE
#: Elements per index head.
INDEX_HEAD_DIM: int = _core.INDEXER_HEAD_DIM
#: Bytes per cache page: 64 x 128 FP8 values, then 64 float32 scales (planar).
INDEX_PAGE_BYTES: int = _core.INDEXER_PAGE_BYTES
#: The top-k sizes the selection kernels are built for.
SUPPORTED_TOPK: tuple[int, ...] = _core.INDEXER_SUPPORTED_TOPK
#: Name of the one scratch buffer in ``Plan.scratch_specs()``.
SCRATCH_NAME: str = _core.INDEXER_SCRATCH_NAME

Caps = _core.IndexerCaps
Plan = _core.IndexerPlan
Binding = _core.IndexerBinding
ScratchSpec = _core.IndexerScratchSpec
ScratchLayout = _core.IndexerScratchLayout
ScratchRegion = _core.IndexerScratchRegion

# Straight to the extension: no Python frame on the hot path.
plan = _core.indexer_plan
bind = _core.indexer_bind
run = _core.indexer_run


def is_supported(device: Any = None) -> bool:
    """True when :func:`run` can execute on a GPU here.

    Needs a CUDA driver with a device and FP8 MMA (compute capability 8.9 or
    newer) on ``device`` (b12x's device grammar; default: the current CUDA
    device). CPU tensors always run the reference.
    """
    from b12x import cuda

    if not cuda.is_available():
        return False
    try:
        major, minor = _core.device_info(cuda.device_index(device, op="is_supported"))[
            "compute_capability"
        ]
    except Exception:
        return False
    return (major, minor) >= _core.MIN_COMPUTE_CAPABILITY


def check(device: Any) -> None:
    """Raises the first page-table fault that runs on ``device`` met since the last check.

    ``Binding.check()`` for every binding of the device (b12x's device
    grammar: "cpu", a CUDA device, or None for the current CUDA device):
    syncs the device, raises :class:`b12x.errors.PageTableError` naming
    ``page_table[row, column]`` and the id when a run met a page id at or past
    ``index_k_cache.shape[0]``, and clears the record. A CUDA device must have
    a plan (its kernels loaded). Not for hot paths or graph captures.
    """
    _, index = _core.resolve_device(device, "check")
    _core.indexer_check(index)


def clear_caches() -> None:
    """Forget every interned plan (plans already handed out stay valid)."""
    _core.indexer_clear_plans()


def cached_plan_count() -> int:
    """How many plans the intern cache holds."""
    return _core.indexer_plan_count()


def scratch_views(binding: Any) -> dict[str, Any]:
    """Typed tensor views of a binding's scratch regions, by region name.

    For inspection and tests; kernels get the region addresses from the plan.
    Builds new view objects, so keep it out of hot paths.
    """
    base = binding.scratch.reshape(-1)
    return {
        r.name: base[r.offset : r.offset + r.nbytes].view(r.dtype).view(r.shape)
        for r in binding.plan.layout.regions
    }
