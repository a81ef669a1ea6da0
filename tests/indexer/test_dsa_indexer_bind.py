"""dsa_indexer.bind: precise errors for every bad operand, aliasing, no side effects."""

from __future__ import annotations

import gc
import weakref

import b12x
import pytest
import torch
from b12x.attention import dsa_indexer as di
from dsa_indexer_cases import caps_for, make_inputs, operands

ROWS, HEADS, WIDTH, TOPK = 3, 16, 4, 512


@pytest.fixture
def inputs():
    return make_inputs(rows=ROWS, heads=HEADS, width=WIDTH, lengths=[200, 100, 0])


@pytest.fixture
def plan(inputs):
    return di.plan(caps_for(inputs, TOPK))


def misaligned(shape, dtype, offset_bytes):
    """A tensor of `shape` whose address is `offset_bytes` past a 64-byte boundary."""
    n = 1
    for d in shape:
        n *= d
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.empty(n * itemsize + 128, dtype=torch.uint8)
    start = (-raw.data_ptr()) % 64 + offset_bytes
    return raw[start : start + n * itemsize].view(dtype).view(shape)


def test_valid_bind_aliases_every_tensor(inputs, plan):
    ops = operands(inputs, plan)
    b = di.bind(plan, **ops)
    assert isinstance(b, di.Binding)
    assert b.plan is plan
    for name, t in ops.items():
        assert getattr(b, name) is t, name
    assert (b.rows, b.width, b.route) == (ROWS, WIDTH, "paged_decode")
    # the launch values themselves are b12x-core's (rust/core/src/indexer/bind.rs tests)
    for r in plan.layout.regions:
        assert b.region_address(r.name) == ops["scratch"].data_ptr() + r.offset
    assert repr(b).startswith("Binding(rows=3, width=4, scores=true")


def test_scores_are_optional(inputs, plan):
    b = di.bind(plan, **operands(inputs, plan, output_scores=None))
    assert b.output_scores is None and "scores=false" in repr(b)


@pytest.mark.parametrize("form", ["tensor", "list", "tuple", "dict", "larger", "2d"])
def test_scratch_forms(inputs, plan, form):
    size = {"larger": (plan.nbytes + 4096,), "2d": (2, plan.nbytes)}.get(form, (plan.nbytes,))
    t = torch.empty(size, dtype=torch.uint8)
    scratch = {"list": [t], "tuple": (t,), "dict": {"paged_indexer.scratch": t}}.get(form, t)
    b = di.bind(plan, **operands(inputs, plan, scratch=scratch))
    assert b.scratch is t


def test_bind_leaves_scratch_and_outputs_untouched(inputs, plan):
    ops = operands(inputs, plan)
    ops["scratch"] = torch.randint(0, 256, (plan.nbytes,), dtype=torch.uint8)
    ops["output_indices"].fill_(-7)
    ops["output_scores"].fill_(3.5)
    before = {k: v.clone() for k, v in ops.items()}
    di.bind(plan, **ops)
    for k, v in ops.items():
        assert torch.equal(v, before[k]), k


def test_bind_retains_nothing_in_the_plan(inputs, plan):
    facts = (plan.nbytes, plan.max_q_rows, plan.max_page_table_width, plan.route)
    ops = operands(inputs, plan)
    scratch_ref = weakref.ref(ops["scratch"])
    b = di.bind(plan, **ops)
    del b, ops
    gc.collect()
    assert scratch_ref() is None  # only the binding held it
    assert (plan.nbytes, plan.max_q_rows, plan.max_page_table_width, plan.route) == facts
    assert di.plan(caps_for(inputs, TOPK)) is plan


def test_capacity_is_inclusive(inputs):
    p = di.plan(caps_for(inputs, TOPK))  # rows 3, width 4 are exact buckets
    assert (p.max_q_rows, p.max_page_table_width) == (3, 4)
    di.bind(p, **operands(inputs, p))


def shared_table(inputs):
    return inputs["page_table"][:1].expand(ROWS, WIDTH)


BAD = {
    # q_fp8
    "q_fp8 dtype": (
        lambda i: {"q_fp8": i["q_fp8"].float().bfloat16()},
        b12x.DTypeError,
        r"^bind: q_fp8 expected dtype float8_e4m3fn, got bfloat16$",
    ),
    "q_fp8 heads": (
        lambda i: {"q_fp8": torch.zeros((ROWS, 32, 128)).to(torch.float8_e4m3fn)},
        b12x.ShapeError,
        r"^bind: q_fp8 expected shape \(\*, 16, 128\), got \[3, 32, 128\]$",
    ),
    "q_fp8 dim": (
        lambda i: {"q_fp8": torch.zeros((ROWS, HEADS, 64)).to(torch.float8_e4m3fn)},
        b12x.ShapeError,
        r"q_fp8 expected shape \(\*, 16, 128\)",
    ),
    "q_fp8 rank": (
        lambda i: {"q_fp8": i["q_fp8"][0]},
        b12x.ShapeError,
        r"q_fp8 expected rank 3, got rank 2",
    ),
    "q_fp8 strides": (
        lambda i: {
            "q_fp8": torch.zeros((HEADS, ROWS, 128)).to(torch.float8_e4m3fn).transpose(0, 1)
        },
        b12x.LayoutError,
        r"q_fp8 expected contiguous \(row-major\) strides, got strides \[128, 384, 1\]",
    ),
    "q_fp8 rows over capacity": (
        lambda i: {"q_fp8": torch.zeros((ROWS + 1, HEADS, 128)).to(torch.float8_e4m3fn)},
        b12x.CapacityError,
        r"^bind: q_fp8.shape\[0\] \(rows\) expected at most 3, got 4; the plan's max_q_rows "
        r"capacity is 3; make a plan with max_q_rows >= 4$",
    ),
    "q_fp8 misaligned": (
        lambda i: {"q_fp8": misaligned((ROWS, HEADS, 128), torch.float8_e4m3fn, 8)},
        b12x.AlignmentError,
        r"q_fp8 expected 16-byte alignment, got address 0x[0-9a-f]+ \(address % 16 = 8\)",
    ),
    "q_fp8 not a tensor": (
        lambda i: {"q_fp8": [1, 2, 3]},
        b12x.NotATensorError,
        r"^bind: q_fp8 expected a tensor \(torch.Tensor or a __dlpack__ producer\), got list$",
    ),
    "q_fp8 device": (
        lambda i: {
            "q_fp8": torch.empty((ROWS, HEADS, 128), dtype=torch.float8_e4m3fn, device="meta")
        },
        b12x.DeviceError,
        r"^bind: q_fp8 expected device cpu, got meta$",
    ),
    # query_weights
    "query_weights dtype": (
        lambda i: {"query_weights": i["query_weights"].bfloat16()},
        b12x.DTypeError,
        r"^bind: query_weights expected dtype float32, got bfloat16$",
    ),
    "query_weights trailing dim": (
        lambda i: {"query_weights": torch.zeros((ROWS, HEADS, 2))},
        b12x.ShapeError,
        r"^bind: query_weights expected shape \(3, 16\) or \(3, 16, 1\), got \[3, 16, 2\]$",
    ),
    "query_weights rows": (
        lambda i: {"query_weights": torch.zeros((ROWS - 1, HEADS))},
        b12x.ShapeError,
        r"query_weights expected shape \(3, 16\) or \(3, 16, 1\), got \[2, 16\]",
    ),
    "query_weights strides": (
        lambda i: {"query_weights": torch.zeros((HEADS, ROWS)).t()},
        b12x.LayoutError,
        r"query_weights expected contiguous",
    ),
    "query_weights device": (
        lambda i: {"query_weights": torch.zeros((ROWS, HEADS), device="meta")},
        b12x.DeviceError,
        r"^bind: query_weights expected device cpu, got meta$",
    ),
    # index_k_cache
    "index_k_cache dtype": (
        lambda i: {"index_k_cache": i["index_k_cache"].view(torch.int8)},
        b12x.DTypeError,
        r"index_k_cache expected dtype uint8, got int8",
    ),
    "index_k_cache page bytes": (
        lambda i: {"index_k_cache": torch.zeros((4, 8192), dtype=torch.uint8)},
        b12x.ShapeError,
        r"^bind: index_k_cache expected shape \(\*, 8448\), got \[4, 8192\]$",
    ),
    "index_k_cache interleaved view": (
        lambda i: {"index_k_cache": torch.zeros((4, 64, 132), dtype=torch.uint8)},
        b12x.ShapeError,
        r"index_k_cache expected rank 2, got rank 3 \(shape \[4, 64, 132\]\)",
    ),
    "index_k_cache inner stride": (
        lambda i: {"index_k_cache": torch.zeros((4, 8448 * 2), dtype=torch.uint8)[:, ::2]},
        b12x.LayoutError,
        r"index_k_cache expected inner stride 1 .* strides, got strides \[16896, 2\]",
    ),
    "index_k_cache short page stride": (
        lambda i: {
            "index_k_cache": torch.zeros(4 * 8448, dtype=torch.uint8).as_strided(
                (4, 8448), (8432, 1)
            )
        },
        b12x.LayoutError,
        r"index_k_cache expected a page stride >= 8448 bytes .* got strides \[8432, 1\]",
    ),
    "index_k_cache odd page stride": (
        lambda i: {"index_k_cache": torch.zeros((4, 8456), dtype=torch.uint8)[:, :8448]},
        b12x.LayoutError,
        r"index_k_cache expected a page stride that is a multiple of 16 bytes",
    ),
    "index_k_cache misaligned": (
        lambda i: {"index_k_cache": misaligned((4, 8448), torch.uint8, 4)},
        b12x.AlignmentError,
        r"index_k_cache expected 16-byte alignment",
    ),
    # page_table
    "page_table dtype": (
        lambda i: {"page_table": i["page_table"].long()},
        b12x.DTypeError,
        r"^bind: page_table expected dtype int32, got int64$",
    ),
    "page_table rows": (
        lambda i: {"page_table": i["page_table"][:2]},
        b12x.ShapeError,
        r"^bind: page_table expected shape \(3, \*\), got \[2, 4\]$",
    ),
    "page_table width over capacity": (
        lambda i: {"page_table": torch.zeros((ROWS, WIDTH + 1), dtype=torch.int32)},
        b12x.CapacityError,
        r"^bind: page_table.shape\[1\] \(width\) expected at most 4, got 5; the plan's "
        r"max_page_table_width capacity is 4",
    ),
    "page_table empty": (
        lambda i: {"page_table": torch.zeros((ROWS, 0), dtype=torch.int32)},
        b12x.ShapeError,
        r"page_table expected shape \(3, >= 1\), got \[3, 0\]",
    ),
    "page_table strides": (
        lambda i: {"page_table": torch.zeros((ROWS, 2 * WIDTH), dtype=torch.int32)[:, ::2]},
        b12x.LayoutError,
        r"page_table expected contiguous \(row-major\) strides, got strides \[8, 2\]",
    ),
    "page_table shared in decode": (
        lambda i: {"page_table": shared_table(i)},
        b12x.LayoutError,
        r"page_table expected contiguous \(a decode plan reads one page-table row per query "
        r"row; a row-shared stride-0 table is accepted only by prefill plans\) strides, got "
        r"strides \[0, 1\]",
    ),
    # cache_lengths / active_width
    "cache_lengths dtype": (
        lambda i: {"cache_lengths": i["cache_lengths"].long()},
        b12x.DTypeError,
        r"cache_lengths expected dtype int32, got int64",
    ),
    "cache_lengths rows": (
        lambda i: {"cache_lengths": torch.zeros(ROWS + 1, dtype=torch.int32)},
        b12x.ShapeError,
        r"^bind: cache_lengths expected shape \(3\), got \[4\]$",
    ),
    "cache_lengths strides": (
        lambda i: {"cache_lengths": torch.zeros(2 * ROWS, dtype=torch.int32)[::2]},
        b12x.LayoutError,
        r"cache_lengths expected contiguous",
    ),
    "active_width shape": (
        lambda i: {"active_width": torch.zeros(2, dtype=torch.int32)},
        b12x.ShapeError,
        r"^bind: active_width expected shape \(1\), got \[2\]$",
    ),
    "active_width dtype": (
        lambda i: {"active_width": torch.zeros(1, dtype=torch.float32)},
        b12x.DTypeError,
        r"active_width expected dtype int32, got float32",
    ),
    # outputs
    "output_indices shape": (
        lambda i: {"output_indices": torch.empty((ROWS, TOPK + 1), dtype=torch.int32)},
        b12x.ShapeError,
        r"^bind: output_indices expected shape \(3, 512\), got \[3, 513\]$",
    ),
    "output_indices dtype": (
        lambda i: {"output_indices": torch.empty((ROWS, TOPK), dtype=torch.int64)},
        b12x.DTypeError,
        r"output_indices expected dtype int32, got int64",
    ),
    "output_indices strides": (
        lambda i: {"output_indices": torch.empty((TOPK, ROWS), dtype=torch.int32).t()},
        b12x.LayoutError,
        r"output_indices expected contiguous",
    ),
    "output_indices misaligned": (
        lambda i: {"output_indices": misaligned((ROWS, TOPK), torch.int32, 4)},
        b12x.AlignmentError,
        r"output_indices expected 16-byte alignment, got address 0x[0-9a-f]+ \(address % 16 = 4\)",
    ),
    "output_scores dtype": (
        lambda i: {"output_scores": torch.empty((ROWS, TOPK), dtype=torch.float16)},
        b12x.DTypeError,
        r"output_scores expected dtype float32, got float16",
    ),
    "output_scores shape": (
        lambda i: {"output_scores": torch.empty((ROWS, TOPK // 2), dtype=torch.float32)},
        b12x.ShapeError,
        r"output_scores expected shape \(3, 512\), got \[3, 256\]",
    ),
    "output_scores device": (
        lambda i: {"output_scores": torch.empty((ROWS, TOPK), device="meta")},
        b12x.DeviceError,
        r"output_scores expected device cpu",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_each_bad_operand_is_rejected_precisely(inputs, plan, case):
    change, error, message = BAD[case]
    with pytest.raises(error, match=message):
        di.bind(plan, **operands(inputs, plan, **change(inputs)))


def test_larger_page_stride_is_accepted(inputs, plan):
    padded = torch.zeros((8, 8448 + 16 * 7), dtype=torch.uint8)[:, :8448]
    b = di.bind(plan, **operands(inputs, plan, index_k_cache=padded))
    assert b.index_k_cache is padded  # core passes the stride on (its bind tests)


def test_weights_with_a_trailing_singleton_are_accepted(inputs, plan):
    w = inputs["query_weights"][..., None]
    assert di.bind(plan, **operands(inputs, plan, query_weights=w)).query_weights is w


def test_shared_table_only_in_prefill(inputs):
    prefill = di.plan(caps_for(inputs, TOPK, mode="prefill"))
    b = di.bind(prefill, **operands(inputs, prefill, page_table=shared_table(inputs)))
    assert b.route == "packed_contiguous"
    with pytest.raises(b12x.LayoutError, match=r"expected row-shared \(0, 1\) \(a prefill plan"):
        di.bind(prefill, **operands(inputs, prefill))
    # one query row is both shapes at once
    one = {k: v[:1] if k not in ("index_k_cache", "active_width") else v for k, v in inputs.items()}
    out = torch.empty((1, TOPK), dtype=torch.int32)
    for p in (prefill, di.plan(caps_for(inputs, TOPK))):
        b = di.bind(p, **operands(one, p, output_indices=out, output_scores=None))
        assert b.rows == 1


SCRATCH_BAD = {
    "too small": (
        lambda p: torch.empty(p.nbytes - 1, dtype=torch.uint8),
        b12x.CapacityError,
        r"^bind: scratch expected at least (\d+) bytes \(plan.nbytes\), got \d+; size it with "
        r"plan.scratch_specs\(\) or plan.shapes_and_dtypes\(\)$",
    ),
    "misaligned": (
        lambda p: misaligned((p.nbytes,), torch.uint8, 1),
        b12x.AlignmentError,
        r"^bind: scratch expected 16-byte alignment, got address 0x[0-9a-f]+ \(address % 16 = 1\)",
    ),
    "dtype": (
        lambda p: torch.empty(p.nbytes, dtype=torch.float32),
        b12x.DTypeError,
        r"^bind: scratch expected dtype uint8, got float32$",
    ),
    "strided": (
        lambda p: torch.empty(2 * p.nbytes, dtype=torch.uint8)[::2],
        b12x.LayoutError,
        r"scratch expected contiguous",
    ),
    "device": (
        lambda p: torch.empty(p.nbytes, dtype=torch.uint8, device="meta"),
        b12x.DeviceError,
        r"^bind: scratch expected device cpu",
    ),
    "two-element list": (
        lambda p: [torch.empty(p.nbytes, dtype=torch.uint8)] * 2,
        b12x.ConfigError,
        r"^bind: scratch expected a uint8 tensor, a mapping \{\"paged_indexer.scratch\": "
        r"tensor\} or a one-element sequence, got a list of 2 items$",
    ),
    "mapping without the name": (
        lambda p: {"other": torch.empty(p.nbytes, dtype=torch.uint8)},
        b12x.ConfigError,
        r"got a mapping with keys \['other'\]$",
    ),
    "not a tensor": (
        lambda p: 1234,
        b12x.NotATensorError,
        r"^bind: scratch expected a tensor .*, got int$",
    ),
}


@pytest.mark.parametrize("case", list(SCRATCH_BAD), ids=list(SCRATCH_BAD))
def test_bad_scratch_is_rejected_precisely(inputs, plan, case):
    make, error, message = SCRATCH_BAD[case]
    with pytest.raises(error, match=message) as e:
        di.bind(plan, **operands(inputs, plan, scratch=make(plan)))
    if case == "too small":
        assert f"at least {plan.nbytes} bytes" in str(e.value)


def test_outputs_must_not_overlap_the_scratch_or_each_other(inputs, plan):
    big = torch.empty(plan.nbytes + 2 * ROWS * TOPK * 4, dtype=torch.uint8)
    inside = big[1024 : 1024 + ROWS * TOPK * 4].view(torch.int32).view(ROWS, TOPK)
    with pytest.raises(b12x.ConfigError, match=r"output_indices expected memory disjoint from"):
        di.bind(plan, **operands(inputs, plan, scratch=big, output_indices=inside))
    both = torch.empty((ROWS, TOPK), dtype=torch.int32)
    with pytest.raises(b12x.ConfigError, match=r"output_scores expected memory disjoint from out"):
        di.bind(
            plan,
            **operands(inputs, plan, output_indices=both, output_scores=both.view(torch.float32)),
        )
    # bytes of a larger scratch past plan.nbytes are free for the caller
    tail = big[-(ROWS * TOPK * 4) :].view(torch.int32).view(ROWS, TOPK)
    di.bind(plan, **operands(inputs, plan, scratch=big, output_indices=tail))


def test_plan_argument_must_be_a_plan(inputs, plan):
    with pytest.raises(TypeError):
        di.bind("plan", **operands(inputs, plan))


@pytest.mark.gpu
def test_cpu_tensor_for_a_cuda_plan_is_a_device_error(inputs):
    cuda_caps = di.Caps(
        device="cuda:0", num_q_heads=HEADS, max_q_rows=ROWS, max_page_table_width=WIDTH, topk=TOPK
    )
    p = di.plan(cuda_caps)
    cuda_inputs = {k: v.cuda() for k, v in inputs.items()}
    ops = operands(cuda_inputs, p, scratch=torch.empty(p.nbytes, dtype=torch.uint8, device="cuda"))
    ops["output_indices"] = ops["output_indices"].cuda()
    ops["output_scores"] = ops["output_scores"].cuda()
    di.bind(p, **ops)
    ops["cache_lengths"] = inputs["cache_lengths"]
    with pytest.raises(
        b12x.DeviceError, match=r"^bind: cache_lengths expected device cuda:0, got cpu$"
    ):
        di.bind(p, **ops)
