"""The declared invocation record: every rule of spec §2, in the reference's order."""

from __future__ import annotations

import dataclasses
import math
import types

import b12x
import numpy as np
import pytest
import torch
from b12x.comm.pcie import DeclaredPlanIndex, Invocation, plan_key

FUSED = "all_reduce_fused_add_rms_norm"
WEIGHT = torch.ones(8)


def plain(**overrides):
    fields = {"name": "layers.0.all_reduce", "operation": "all_reduce", "shape": (2, 8)}
    fields["dtype"] = torch.bfloat16
    fields.update(overrides)
    return Invocation(**fields)


def fused(**overrides):
    fields = {"operation": FUSED, "norm_weight": WEIGHT, "epsilon": 1e-6}
    fields.update(overrides)
    return plain(**fields)


def rejects(match, **overrides):
    """The invocation raises a ValueError (b12x.ConfigError) whose message matches."""
    make = fused if overrides.get("operation") == FUSED else plain
    with pytest.raises(b12x.ConfigError, match=match) as info:
        make(**overrides)
    assert isinstance(info.value, ValueError)
    return str(info.value)


def test_valid_records_keep_their_fields():
    inv = plain(strides=[8, 1], channel_id="moe")
    assert inv.shape == (2, 8)
    assert inv.strides == (8, 1)  # lists are stored as tuples
    assert inv.input_alignment == 16
    assert inv.channel_id == "moe"
    assert inv.persistent_input is None
    f = fused(epsilon=0.0, input_alignment=256)
    assert f.norm_weight is WEIGHT
    # a scalar shape passes, as in the reference
    assert plain(shape=()).shape == ()
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert plain(dtype=dtype).dtype is dtype


def test_records_are_frozen_and_compared_by_identity():
    inv = plain()
    with pytest.raises(dataclasses.FrozenInstanceError):
        inv.shape = (4, 8)  # type: ignore[misc]
    twin = plain()
    assert inv == inv
    assert inv != twin
    assert plan_key(inv) == plan_key(twin)


@pytest.mark.parametrize("operation", ["all_gather", "ALL_REDUCE", "", None, 3])
def test_rule_1_operation(operation):
    msg = rejects("operation of invocation", operation=operation)
    assert "expected a supported PCIe collective operation" in msg
    assert msg.endswith(f"got {operation!r}")


def test_rule_1_comes_first():
    # everything else is wrong too; the operation is reported
    with pytest.raises(b12x.ConfigError, match="operation of invocation"):
        Invocation(name="", operation="nope", shape=(0,), dtype=torch.float64, input_alignment=3)


@pytest.mark.parametrize("name", ["", None, 7])
def test_rule_2_nonempty_name(name):
    msg = rejects("name of invocation", name=name)
    assert "expected a nonempty name" in msg


@pytest.mark.parametrize(
    "shape", [(2, 0), (-1, 8), (2, True), (2.0, 8), (np.int64(2), 8), (2, None), 8, "28"]
)
def test_rule_2_positive_shape_of_exact_ints(shape):
    msg = rejects("shape of invocation", shape=shape)
    assert "expected a positive shape" in msg


def test_rule_2_rank_is_bounded():
    rejects("at most 8 dimensions", shape=(1,) * 9)


@pytest.mark.parametrize(
    "dtype", [torch.float64, torch.int32, torch.float8_e4m3fn, "bfloat16", np.float16, None]
)
def test_rule_3_dtype(dtype):
    msg = rejects("dtype of invocation", dtype=dtype)
    assert "expected a supported dtype (float16, bfloat16 or float32)" in msg


def test_rule_2_comes_before_rule_3():
    rejects("shape of invocation", shape=(0,), dtype=torch.float64)


@pytest.mark.parametrize("strides", [(8,), (8, 0), (-8, 1), (8, 1, 1), (8, True), (8.0, 1), 8])
def test_rule_4_strides_match_the_shape(strides):
    msg = rejects("strides of invocation", strides=strides)
    assert "expected strides matching its shape (2, 8) (2 ints > 0)" in msg


def test_rule_3_comes_before_rule_4():
    rejects("dtype of invocation", dtype=torch.int8, strides=(0, 0))


@pytest.mark.parametrize("alignment", [8, 0, -16, 24, 48, True, 16.0, None])
def test_rule_5_alignment(alignment):
    msg = rejects("input_alignment of invocation", input_alignment=alignment)
    assert "expected a power of two >= 16" in msg


@pytest.mark.parametrize("alignment", [16, 32, 4096])
def test_rule_5_accepts_powers_of_two(alignment):
    assert plain(input_alignment=alignment).input_alignment == alignment


def test_rule_4_comes_before_rule_5():
    rejects("strides of invocation", strides=(0, 1), input_alignment=3)


def test_rule_6_fused_needs_exactly_one_norm_weight():
    msg = rejects("norm_weight of invocation", operation=FUSED, norm_weight=None)
    assert "expected exactly one norm weight (fused PCIe invocation), got None" in msg
    msg = rejects("norm_weight of invocation", norm_weight=WEIGHT)
    assert "only the fused PCIe invocation takes a norm weight" in msg


def test_rule_6_norm_weight_is_a_tensor():
    with pytest.raises(b12x.NotATensorError, match=r"norm_weight of invocation .* got list") as e:
        fused(norm_weight=[1.0] * 8)
    assert isinstance(e.value, TypeError)


@pytest.mark.parametrize(
    "weight", [torch.ones(7), torch.ones(2, 8), torch.ones(8, 1), torch.ones(())]
)
def test_rule_6b_the_norm_weight_has_one_value_per_row_element(weight):
    # caught when declared, not at the first call (issue 21, item 9)
    rejects(
        r"norm_weight of invocation .* expected shape \(8,\)", operation=FUSED, norm_weight=weight
    )
    assert fused(norm_weight=torch.ones(8)).norm_weight.shape == (8,)


def test_rule_5_comes_before_rule_6():
    rejects("input_alignment", operation=FUSED, norm_weight=None, input_alignment=8)


@pytest.mark.parametrize("epsilon", [None, -1e-6, math.nan, "1e-6", True])
def test_rule_7_fused_needs_a_nonnegative_epsilon(epsilon):
    msg = rejects("epsilon of invocation", operation=FUSED, epsilon=epsilon)
    assert "expected a nonnegative epsilon" in msg


def test_rule_7_accepts_ints_and_zero():
    assert fused(epsilon=0).epsilon == 0
    assert plan_key(fused(epsilon=1))[4] == (id(WEIGHT), 1.0)


def test_rule_6_comes_before_rule_7():
    rejects("norm_weight", operation=FUSED, norm_weight=None, epsilon=-1.0)


def test_rule_8_plain_carries_no_rmsnorm_controls():
    msg = rejects("epsilon of invocation", epsilon=1e-6)
    assert "a plain PCIe invocation cannot carry RMSNorm controls" in msg
    assert msg.endswith("got 1e-6")


def test_plan_key_normalises_strides_and_keys_weights_by_identity():
    assert plan_key(plain()) == ("all_reduce", (2, 8), "bfloat16", (8, 1), None)
    assert plan_key(plain(shape=(1, 8), strides=(10, 1)))[3] == (0, 1)
    assert plan_key(fused()) == (FUSED, (2, 8), "bfloat16", (8, 1), (id(WEIGHT), 1e-6))
    clone = WEIGHT.clone()
    assert plan_key(fused(norm_weight=clone))[4] == (id(clone), 1e-6)


def test_any_record_with_the_fields_indexes():
    record = types.SimpleNamespace(
        name="x",
        operation="all_reduce",
        shape=(4,),
        dtype=torch.float32,
        strides=None,
        input_alignment=16,
        norm_weight=None,
        epsilon=None,
    )
    index = DeclaredPlanIndex([(record, "plan")])
    assert index.lookup(torch.empty(4)) == "plan"
    # the same rules apply to it
    record.shape = (0,)
    with pytest.raises(b12x.ConfigError, match="positive shape"):
        index.rebuild([(record, "plan")])
    del record.epsilon
    with pytest.raises(TypeError, match="without epsilon"):
        index.rebuild([(record, "plan")])
    assert index.lookup(torch.empty(4)) == "plan"  # a failed rebuild changes nothing
