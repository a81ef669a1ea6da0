"""Test/bench-only driver of the indexer kernels by raw pointers.

Stands in for ``dsa_indexer.plan/bind/run`` until the planning layer drives
the kernels: it carves the scratch regions the launcher needs and passes
tensor addresses to ``_core._indexer_launch_raw``. Not a public API.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from b12x import _core
from b12x.cuda import current_stream

ALIGN = 1024


def _up(x: int, a: int = ALIGN) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class RawPlan:
    rows_cap: int
    heads: int
    width: int
    topk: int
    supertile: int
    slices: int = 1
    prefill: bool = False
    physical: bool = False
    flavor: int = 0  # 0 = the device's, 1 = e4m3 MMA, 2 = f16 MMA

    @property
    def regions(self) -> dict[str, tuple[int, int]]:
        """name -> (byte offset, bytes) inside the scratch."""
        r, s, k = self.rows_cap, self.supertile, self.topk
        sizes = [
            ("logits", 4 * r * s),
            ("carry_values", 4 * 2 * r * k),
            ("carry_indices", 4 * 2 * r * k),
            ("partial_values", 4 * r * self.slices * k if self.slices > 1 else 0),
            ("partial_indices", 4 * r * self.slices * k if self.slices > 1 else 0),
        ]
        out, cur = {}, 0
        for name, n in sizes:
            off = _up(cur)
            out[name] = (off, n)
            cur = off + n
        return out

    @property
    def scratch_bytes(self) -> int:
        return max(_up(max(off + n for off, n in self.regions.values())), ALIGN)


def launch(
    plan: RawPlan,
    scratch: Any,
    q: Any,
    weights: Any,
    kcache: Any,
    page_table: Any,
    lengths: Any,
    active_width: Any,
    out_indices: Any,
    out_scores: Any = None,
) -> None:
    """Enqueues one indexer call on torch's current stream (no checks: test use only)."""
    dev = q.get_device()
    base = scratch.data_ptr()
    reg = plan.regions

    def at(name: str) -> int:
        off, n = reg[name]
        return base + off if n else 0

    _core._indexer_launch_raw(
        dev,
        current_stream(dev),
        plan.prefill,
        plan.physical,
        q.shape[0],
        q.shape[1],
        page_table.shape[1],
        plan.topk,
        plan.supertile,
        plan.slices,
        plan.rows_cap,
        q.data_ptr(),
        weights.data_ptr(),
        kcache.data_ptr(),
        kcache.stride(0) * kcache.element_size(),
        page_table.data_ptr(),
        page_table.stride(0),
        lengths.data_ptr(),
        active_width.data_ptr(),
        out_indices.data_ptr(),
        out_scores.data_ptr() if out_scores is not None else 0,
        at("logits"),
        at("carry_values"),
        at("carry_indices"),
        at("partial_values"),
        at("partial_indices"),
        plan.flavor,
    )


LOGITS_BUDGET = 1 << 23  # f32 elements of the logits region a decode plan may take
SLICE_MIN = 8192


def default_policy(rows: int, width: int, prefill: bool, sms: int) -> tuple[int, int]:
    """(supertile, top-k slices): few decode rows get one large chunk (no
    serial carry chain) split across CTAs for the top-k; prefill keeps 32768."""
    tokens = _up(width * 64, 512)
    if prefill:
        return min(tokens, 32768), 1
    cap = max(32768, LOGITS_BUDGET // max(rows, 1) // 512 * 512)
    supertile = min(tokens, cap)
    slices = max(1, min(sms // (2 * max(rows, 1)), supertile // SLICE_MIN))
    return supertile, slices
