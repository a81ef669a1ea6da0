"""Small dsa_indexer problems for tests, on any device (GPU tests reuse them)."""

from __future__ import annotations

from typing import Any

import torch
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref


def make_inputs(
    *,
    rows: int,
    heads: int,
    width: int,
    lengths: int | list[int],
    pages: int | None = None,
    mode: str = "decode",
    page_stride: int = ref.PAGE_BYTES,
    active_width: int | None = None,
    unmapped: tuple[tuple[int, int], ...] = (),
    device: str = "cpu",
    seed: int = 0,
) -> dict[str, Any]:
    """Operands of one call (without scratch and outputs).

    Decode rows get distinct random pages; prefill rows share one row as a
    stride-0 view. ``unmapped`` lists (row, page column) entries set to -1.
    """
    g = torch.Generator().manual_seed(seed)
    table_rows = 1 if mode == "prefill" else rows
    pages = pages if pages is not None else table_rows * width + 3
    k = torch.randn((pages, ref.PAGE_SIZE, ref.HEAD_DIM), generator=g)
    k_fp8, scales = ref.quantize_index_k(k)
    cache = ref.pack_index_k_cache(k_fp8, scales, page_stride=page_stride)
    q = (torch.randn((rows, heads, ref.HEAD_DIM), generator=g) * 4).to(torch.float8_e4m3fn)
    weights = torch.randn((rows, heads), generator=g) * heads**-0.5
    table = torch.zeros((table_rows, width), dtype=torch.int32)
    for r in range(table_rows):
        table[r] = torch.randperm(pages, generator=g)[:width]
    for r, c in unmapped:
        table[r, c] = -1
    if mode == "prefill":
        table = table[:1].expand(rows, width)
    if isinstance(lengths, int):
        lengths = [lengths] * rows
    lens = torch.tensor(lengths, dtype=torch.int32)
    aw = max([*lengths, 0]) if active_width is None else active_width
    out = {
        "q_fp8": q,
        "query_weights": weights,
        "index_k_cache": cache,
        "page_table": table,
        "cache_lengths": lens,
        "active_width": torch.tensor([aw], dtype=torch.int32),
    }
    return {name: t.to(device) for name, t in out.items()}


def caps_for(inputs: dict[str, Any], topk: int, *, mode: str = "decode", **kw: Any) -> di.Caps:
    rows, heads, _ = inputs["q_fp8"].shape
    return di.Caps(
        device=inputs["q_fp8"].device,
        num_q_heads=heads,
        max_q_rows=max(rows, 1),
        max_page_table_width=inputs["page_table"].shape[1],
        topk=topk,
        mode=mode,
        **kw,
    )


def outputs(rows: int, topk: int, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Outputs pre-filled with values no run ever writes, to catch skipped slots."""
    idx = torch.full((rows, topk), 7777, dtype=torch.int32, device=device)
    scores = torch.full((rows, topk), float("nan"), device=device)
    return idx, scores


def bind_all(plan: Any, inputs: dict[str, Any], idx: Any, scores: Any = None, **kw: Any) -> Any:
    scratch = kw.pop("scratch", None)
    if scratch is None:
        scratch = torch.empty(plan.nbytes, dtype=torch.uint8, device=inputs["q_fp8"].device)
    return di.bind(
        plan, scratch=scratch, output_indices=idx, output_scores=scores, **{**inputs, **kw}
    )


def operands(inputs: dict[str, Any], plan: Any, **changes: Any) -> dict[str, Any]:
    """Every keyword of one ``bind``: ``inputs`` plus a fresh scratch and both
    outputs on the inputs' device, then ``changes``."""
    rows, device = inputs["q_fp8"].shape[0], inputs["q_fp8"].device
    ops = {
        "scratch": torch.empty(plan.nbytes, dtype=torch.uint8, device=device),
        **inputs,
        "output_indices": torch.empty((rows, plan.topk), dtype=torch.int32, device=device),
        "output_scores": torch.empty((rows, plan.topk), dtype=torch.float32, device=device),
    }
    ops.update(changes)
    return ops
