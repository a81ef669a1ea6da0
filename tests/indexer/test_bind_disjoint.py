"""dsa_indexer.bind: what the kernels write (scratch, output_indices,
output_scores) shares no byte with anything they read or with each other;
inputs may alias each other. Checked on byte ranges of the strided views."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x.attention import dsa_indexer as di
from dsa_indexer_cases import caps_for, make_inputs, operands

ROWS, HEADS, WIDTH, TOPK = 3, 16, 4, 512
READ = ["q_fp8", "query_weights", "index_k_cache", "page_table", "cache_lengths", "active_width"]
WRITTEN = ["scratch", "output_indices", "output_scores"]


@pytest.fixture
def case():
    inputs = make_inputs(rows=ROWS, heads=HEADS, width=WIDTH, lengths=[200, 100, 0])
    return inputs, di.plan(caps_for(inputs, TOPK))


def nbytes(t):
    return t.numel() * t.element_size()


def over(target, like):
    """Two views of one 64-byte aligned buffer: one shaped like ``target``, and
    one shaped like ``like`` starting on the same byte."""
    raw = torch.empty(max(nbytes(target), nbytes(like)) + 64, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 64
    t = raw[start : start + nbytes(target)].view(target.dtype).view(target.shape)
    w = raw[start : start + nbytes(like)].view(like.dtype).view(like.shape)
    return t, w


@pytest.mark.parametrize("reader", READ)
@pytest.mark.parametrize("writer", WRITTEN)
def test_every_written_operand_over_every_input_is_refused(case, writer, reader):
    inputs, plan = case
    ops = operands(inputs, plan)
    ops[reader], ops[writer] = over(ops[reader], ops[writer])
    with pytest.raises(b12x.ConfigError) as e:
        di.bind(plan, **ops)
    msg = str(e.value)
    assert msg.startswith(f"bind: {writer} expected memory disjoint from {reader}, got bytes"), msg
    assert f"overlapping {reader}'s bytes [0x{ops[reader].data_ptr():x}, " in msg


def test_writers_are_disjoint_from_each_other(case):
    inputs, plan = case
    big = torch.empty(plan.nbytes + 2 * ROWS * TOPK * 4, dtype=torch.uint8)
    inside = big[1024 : 1024 + ROWS * TOPK * 4].view(torch.int32).view(ROWS, TOPK)
    refused = r"^bind: output_indices expected memory disjoint from scratch, got bytes"
    with pytest.raises(b12x.ConfigError, match=refused):
        di.bind(plan, **operands(inputs, plan, scratch=big, output_indices=inside))
    both = torch.empty((ROWS, TOPK), dtype=torch.int32)
    scores = both.view(torch.float32)
    refused = r"^bind: output_scores expected memory disjoint from output_indices"
    with pytest.raises(b12x.ConfigError, match=refused):
        di.bind(plan, **operands(inputs, plan, output_indices=both, output_scores=scores))


def test_a_scratch_over_the_kv_cache_is_refused(case):
    inputs, plan = case
    # the failure the check exists for: the scorer's scratch writes would land in the cache
    cache = torch.zeros((64, 8448), dtype=torch.uint8)
    scratch = cache.view(-1)[: plan.nbytes]
    refused = r"^bind: scratch expected memory disjoint from index_k_cache"
    with pytest.raises(b12x.ConfigError, match=refused):
        di.bind(plan, **operands(inputs, plan, index_k_cache=cache, scratch=scratch))


def test_one_shared_byte_is_enough_and_touching_is_fine(case):
    inputs, plan = case
    raw = torch.empty(plan.nbytes + 64 + 4 * ROWS, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 16
    scratch = raw[start : start + plan.nbytes]
    touching = raw[start + plan.nbytes : start + plan.nbytes + 4 * ROWS].view(torch.int32)
    di.bind(plan, **operands(inputs, plan, scratch=scratch, cache_lengths=touching))
    sharing = raw[start + plan.nbytes - 4 : start + plan.nbytes - 4 + 4 * ROWS].view(torch.int32)
    with pytest.raises(b12x.ConfigError, match=r"scratch expected memory disjoint from cache_len"):
        di.bind(plan, **operands(inputs, plan, scratch=scratch, cache_lengths=sharing))


def test_inputs_may_alias_each_other(case):
    inputs, plan = case
    lens = inputs["cache_lengths"]
    aw = lens[:1]  # active width read from the first length's bytes
    table = torch.zeros((ROWS, WIDTH), dtype=torch.int32)
    b = di.bind(plan, **operands(inputs, plan, active_width=aw, page_table=table))
    assert b.active_width.data_ptr() == b.cache_lengths.data_ptr()
    # the same tensor passed twice for two read-only operands
    shared = torch.zeros(ROWS, dtype=torch.int32)
    b = di.bind(plan, **operands(inputs, plan, cache_lengths=shared, active_width=shared[:1]))
    di.run(b)


def test_the_larger_scratchs_unused_tail_is_the_callers(case):
    inputs, plan = case
    big = torch.empty(plan.nbytes + 4096 + ROWS * TOPK * 4, dtype=torch.uint8)
    tail = big[-(ROWS * TOPK * 4) :].view(torch.int32).view(ROWS, TOPK)
    di.bind(plan, **operands(inputs, plan, scratch=big, output_indices=tail))


def test_the_strided_extent_counts_not_only_the_touched_bytes(case):
    inputs, plan = case
    # pages 8448 + 8192 bytes apart: an output inside the padding after page 2 touches
    # no byte of any page, but it is inside the cache view's byte range and refused
    # (the rule is a cheap, conservative one)
    stride = 8448 + 8192
    padded = torch.zeros((8, stride), dtype=torch.uint8)
    cache = padded[:, :8448]
    start = 2 * stride + 8448
    out = padded.view(-1)[start : start + 4 * ROWS * TOPK].view(torch.int32).view(ROWS, TOPK)
    refused = r"output_indices expected memory disjoint from index_k_cache"
    with pytest.raises(b12x.ConfigError, match=refused):
        di.bind(plan, **operands(inputs, plan, index_k_cache=cache, output_indices=out))
    # past the last page's bytes it is free
    after = padded[7, 8448 : 8448 + 4 * ROWS * TOPK].view(torch.int32).view(ROWS, TOPK)
    di.bind(plan, **operands(inputs, plan, index_k_cache=cache, output_indices=after))


def test_empty_outputs_overlap_nothing(case):
    inputs, _ = case
    kept = ("index_k_cache", "active_width")
    zero = {k: v if k in kept else v[:0] for k, v in inputs.items()}
    p = di.plan(caps_for(inputs, TOPK))
    cache = zero["index_k_cache"]
    empty = cache.view(-1)[:0].view(torch.int32).view(0, TOPK)
    di.bind(
        p,
        scratch=torch.empty(p.nbytes, dtype=torch.uint8),
        **zero,
        output_indices=empty,
        output_scores=None,
    )
