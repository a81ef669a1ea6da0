"""Bad input the indexer's bind and run used to let escape (issue 21, item 9):
each is refused with a b12x error naming the operand, or runs as the page-id
rule says. CPU (the reference), so it runs everywhere."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x.attention import dsa_indexer as di

ROWS, HEADS, WIDTH, TOPK = 2, 16, 2, 512


def plan():
    return di.plan(
        di.Caps(
            device="cpu", num_q_heads=HEADS, max_q_rows=ROWS, max_page_table_width=WIDTH, topk=TOPK
        )
    )


def operands(p, *, pages=4, table_fill=0, **override):
    ops = {
        "scratch": torch.empty(p.nbytes, dtype=torch.uint8),
        "q_fp8": torch.zeros((ROWS, HEADS, di.INDEX_HEAD_DIM)).to(torch.float8_e4m3fn),
        "query_weights": torch.ones((ROWS, HEADS)),
        "index_k_cache": torch.zeros((pages, di.INDEX_PAGE_BYTES), dtype=torch.uint8),
        "page_table": torch.full((ROWS, WIDTH), table_fill, dtype=torch.int32),
        "cache_lengths": torch.full((ROWS,), WIDTH * 64, dtype=torch.int32),
        "active_width": torch.full((1,), WIDTH * 64, dtype=torch.int32),
        "output_indices": torch.empty((ROWS, TOPK), dtype=torch.int32),
    }
    ops.update(override)
    return ops


def test_a_cache_without_pages_runs_every_id_unmapped():
    p = plan()
    b = di.bind(p, **operands(p, pages=0, table_fill=-1))  # valid: nothing is mapped
    di.run(b)
    assert torch.all(b.output_indices == -1)
    b.check()  # nothing recorded: -1 is unmapped, not a fault


def test_ids_into_a_cache_without_pages_are_recorded_for_check():
    p = plan()
    b = di.bind(p, **operands(p, pages=0, table_fill=0))
    di.run(b)
    assert torch.all(b.output_indices == -1)
    with pytest.raises(b12x.PageTableError, match=r"page_table\[0, 0\] .* \[0, 0\) .* got 0"):
        b.check()


@pytest.mark.parametrize(
    ("operand", "change"),
    [
        ("index_k_cache", lambda t: t.resize_(2, t.shape[1])),
        ("page_table", lambda t: t.set_(torch.zeros((ROWS, WIDTH), dtype=torch.int32))),
        ("output_indices", lambda t: setattr(t, "data", torch.empty((ROWS, TOPK), dtype=t.dtype))),
        ("query_weights", lambda t: t.resize_(ROWS * HEADS)),
    ],
)
def test_a_tensor_changed_in_place_after_bind_is_refused_by_name(operand, change):
    p = plan()
    ops = operands(p)
    b = di.bind(p, **ops)
    change(ops[operand])
    with pytest.raises(b12x.B12xError, match=rf"^(run|bind): {operand} expected "):
        di.run(b)
    with pytest.raises(b12x.B12xError, match=rf"^(run|bind): {operand} expected "):
        b.check()
    b2 = di.bind(p, **ops) if operand != "query_weights" else None  # bound again: runs
    if b2 is not None:
        di.run(b2)


def test_scores_that_require_grad_are_refused_at_bind():
    p = plan()
    scores = torch.empty((ROWS, TOPK), requires_grad=True)
    with pytest.raises(
        b12x.ConfigError,
        match=r"^bind: output_scores expected a tensor that does not require grad .*"
        r"got requires_grad=True$",
    ):
        di.bind(p, **operands(p, output_scores=scores))
    b = di.bind(p, **operands(p, output_scores=scores.detach()))
    di.run(b)


def test_operands_on_meta_are_named():
    p = plan()
    q = torch.empty((ROWS, HEADS, di.INDEX_HEAD_DIM), dtype=torch.float8_e4m3fn, device="meta")
    with pytest.raises(b12x.DeviceError, match=r"^bind: q_fp8 expected device cpu, got meta$"):
        di.bind(p, **operands(p, q_fp8=q))
