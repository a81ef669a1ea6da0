"""Property: ``dsa_indexer.bind`` on random operand metadata either binds or
raises a B12xError, never another exception; and what it binds keeps every
written byte range (scratch, outputs) clear of every other operand.

Operands are views of one shared buffer (``as_strided`` at random offsets, so
they overlap), fresh tensors, meta tensors or non-tensors, with random dtypes,
shapes, strides and storage offsets; most draws corrupt only a few operands so
that successful binds are common too.
"""

from __future__ import annotations

import b12x
import numpy as np
import torch
from b12x.attention import dsa_indexer as di
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

HEADS, WIDTH, TOPK, ROWS = 16, 4, 512, 3
POOL = torch.zeros(1 << 22, dtype=torch.uint8)  # 4 MiB every pooled view lives in
POOL_ALIGN = (-POOL.data_ptr()) % 64
DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int32,
    torch.int64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.bool,
    torch.complex64,
]
PLANS = {
    mode: di.plan(
        di.Caps(
            device="cpu",
            num_q_heads=HEADS,
            max_q_rows=ROWS,
            max_page_table_width=WIDTH,
            topk=TOPK,
            mode=mode,
        )
    )
    for mode in ("decode", "prefill")
}
NAMES = [
    "scratch",
    "q_fp8",
    "query_weights",
    "index_k_cache",
    "page_table",
    "cache_lengths",
    "active_width",
    "output_indices",
    "output_scores",
]
WRITTEN = ("scratch", "output_indices", "output_scores")


def pooled(dtype, shape, strides, byte_offset):
    """A view of POOL; None when it would not fit (the draw is discarded)."""
    item = torch.empty((), dtype=dtype).element_size()
    if byte_offset % item:
        byte_offset -= byte_offset % item
    span = sum((d - 1) * s for d, s in zip(shape, strides, strict=True) if d > 0) + 1
    if any(d == 0 for d in shape):
        span = 0
    if POOL_ALIGN + byte_offset + span * item > POOL.numel():
        return None
    flat = POOL[POOL_ALIGN:].view(-1)[: (POOL.numel() - POOL_ALIGN) // 8 * 8].view(dtype)
    return flat.as_strided(shape, strides, byte_offset // item)


def valid_spec(name, rows, width, mode, scratch_bytes):
    """(dtype, shape, strides) of a valid operand."""
    if name == "scratch":
        return torch.uint8, [scratch_bytes], [1]
    if name == "q_fp8":
        return torch.float8_e4m3fn, [rows, HEADS, 128], [HEADS * 128, 128, 1]
    if name == "query_weights":
        return torch.float32, [rows, HEADS], [HEADS, 1]
    if name == "index_k_cache":
        return torch.uint8, [5, 8448], [8448 + 16 * (rows % 2), 1]
    if name == "page_table":
        if mode == "prefill" and rows > 1:
            return torch.int32, [rows, width], [0, 1]
        return torch.int32, [rows, width], [width, 1]
    if name == "cache_lengths":
        return torch.int32, [rows], [1]
    if name == "active_width":
        return torch.int32, [1], [1]
    dtype = torch.int32 if name == "output_indices" else torch.float32
    return dtype, [rows, TOPK], [TOPK, 1]


ASPECTS = ["dtype", "shape", "strides", "offset", "meta", "object", "everything"]


@st.composite
def operand(draw, name, rows, width, mode, plan, corrupt):
    """One operand: valid, or with one aspect (or everything) corrupted; placed in
    the pool near the others, far from them, or in a fresh allocation."""
    aspect = draw(st.sampled_from(ASPECTS)) if corrupt else None
    if aspect == "object":
        return draw(
            st.sampled_from([None, 3, "tensor", [1, 2]])
            | st.builds(lambda: np.zeros((rows, TOPK), dtype=np.int32))
        )
    scratch_bytes = plan.nbytes + draw(st.sampled_from([0, 0, 16, 4096]))
    dtype, shape, strides = valid_spec(name, rows, width, mode, scratch_bytes)
    if aspect in ("dtype", "everything"):
        dtype = draw(st.sampled_from(DTYPES))
    if aspect in ("shape", "everything"):
        rank = draw(st.sampled_from([len(shape), len(shape), 0, 1, 2, 3, 4]))
        dims = st.sampled_from([0, 1, 2, 3, rows, HEADS, 128, TOPK, 8448])
        old = shape
        shape = [draw(st.sampled_from([*old, 0, 1, 2])) if i < len(old) else draw(dims)
                 for i in range(rank)]  # fmt: skip
        strides = strides[:rank] + [1] * (rank - len(strides))
    if aspect in ("strides", "everything"):
        strides = [draw(st.sampled_from([s, 0, 1, 2, 7, 128, 8448, 8456])) for s in strides]
    if aspect == "meta":
        return torch.empty_strided(shape, strides, dtype=dtype, device="meta")
    place = draw(st.sampled_from(["fresh", "near", "near", "far"]))
    if place == "fresh" and aspect is None:
        t = pooled(dtype, shape, strides, 0)  # layout check only
        return None if t is None else torch.empty_strided(shape, strides, dtype=dtype)
    if place == "near":  # a 256 KiB window: operands collide often
        offset = 16 * draw(st.integers(0, (1 << 14) - 1))
    else:
        offset = 16 * draw(st.integers(0, 1 << 17))
    if aspect in ("offset", "everything"):
        offset += draw(st.integers(0, 15))
    return pooled(dtype, shape, strides, offset)


@st.composite
def call(draw):
    mode = draw(st.sampled_from(["decode", "prefill"]))
    plan = PLANS[mode]
    rows = draw(st.integers(0, ROWS))
    width = draw(st.integers(1, WIDTH))
    n_corrupt = draw(st.sampled_from([0, 0, 1, 1, 2, 3]))
    bad = set(draw(st.permutations(NAMES))[:n_corrupt])
    ops = {}
    for name in NAMES:
        if name == "output_scores" and draw(st.booleans()):
            ops[name] = None
            continue
        ops[name] = draw(operand(name, rows, width, mode, plan, name in bad))
        if ops[name] is None and name not in bad:
            assume(False)  # a valid operand that did not fit the pool
    form = draw(st.sampled_from(["tensor"] * 6 + ["list", "tuple", "dict", "other key", "pair"]))
    t = ops["scratch"]
    ops["scratch"] = {
        "tensor": t,
        "list": [t],
        "tuple": (t,),
        "dict": {di.SCRATCH_NAME: t},
        "other key": {"x": t},
        "pair": [t, t],
    }[form]
    return plan, ops


def byte_range(t, nbytes=None):
    if t.numel() == 0:
        return None
    item = t.element_size()
    span = sum((d - 1) * s for d, s in zip(t.shape, t.stride(), strict=True) if d > 1) + 1
    start = t.data_ptr()
    return start, start + (nbytes if nbytes is not None else span * item)


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(call())
def test_bind_binds_or_raises_a_b12x_error(case):
    plan, ops = case
    try:
        binding = di.bind(plan, **ops)
    except b12x.B12xError as e:
        event(f"refused: {type(e).__name__}" + (" (overlap)" if "disjoint" in str(e) else ""))
        return
    event("bound")
    # what was bound: every written range clear of every other operand's range
    scratch = binding.scratch
    ranges = {n: byte_range(getattr(binding, n)) for n in NAMES if getattr(binding, n) is not None}
    ranges["scratch"] = byte_range(scratch, plan.nbytes)
    for w in WRITTEN:
        if ranges.get(w) is None:
            continue
        for other, r in ranges.items():
            if other == w or r is None:
                continue
            a, b = ranges[w], r
            assert not (a[0] < b[1] and b[0] < a[1]), (w, other, a, b)
    assert binding.region_address(plan.layout.regions[0].name) == (
        scratch.data_ptr() + plan.layout.regions[0].offset
    )
