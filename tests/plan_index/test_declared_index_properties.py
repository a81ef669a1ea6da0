"""Property tests: the declared-plan index against a plain Python dict model of spec §4.

The model keys a declaration by ``(operation, shape, dtype, address strides,
norm)`` with address strides zero on size-1 dimensions and norm
``(id(weight), epsilon)`` for the fused operation, and keeps the first
declaration of each key (``dict.setdefault``), as the reference does.
"""

from __future__ import annotations

import pytest
import torch
from b12x.comm.pcie import DeclaredPlanIndex, Invocation, UndeclaredPlanError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FUSED = "all_reduce_fused_add_rms_norm"
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
WEIGHTS = [torch.ones(3), torch.ones(3), torch.full((3,), 2.0)]  # two equal-valued objects
EPSILONS = [0.0, 1e-6, 1e-5]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def contiguous(shape):
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


def model_key(operation, shape, dtype, strides, weight, epsilon):
    address = tuple(0 if d == 1 else s for d, s in zip(shape, strides, strict=True))
    norm = None if operation == "all_reduce" else (id(weight), epsilon)
    return (operation, tuple(shape), dtype, address, norm)


shapes = st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple)


@st.composite
def declarations(draw):
    fused = draw(st.booleans())
    shape = draw(shapes)
    if fused:  # a norm weight has one value per row element: the weights are 3 long
        shape = (*shape[:-1], 3)
    strides = draw(
        st.one_of(
            st.none(),
            st.lists(st.integers(1, 6), min_size=len(shape), max_size=len(shape)).map(tuple),
        )
    )
    return {
        "operation": FUSED if fused else "all_reduce",
        "shape": shape,
        "dtype": draw(st.sampled_from(DTYPES)),
        "strides": strides,
        "norm_weight": draw(st.sampled_from(WEIGHTS)) if fused else None,
        "epsilon": draw(st.sampled_from(EPSILONS)) if fused else None,
    }


@st.composite
def probes(draw, declared):
    """A live call: often a declared one with its size-1 strides changed, else random."""
    if declared and draw(st.booleans()):
        d = draw(st.sampled_from(declared))
        shape, operation, dtype = d["shape"], d["operation"], d["dtype"]
        strides = list(d["strides"] or contiguous(shape))
        for i, extent in enumerate(shape):
            if extent == 1 and draw(st.booleans()):
                strides[i] = draw(st.integers(1, 9))
        weight, epsilon = d["norm_weight"], d["epsilon"]
        if operation == FUSED and draw(st.booleans()):
            weight = draw(st.sampled_from([*WEIGHTS, None]))
            epsilon = draw(st.sampled_from([*EPSILONS, None]))
    else:
        shape = draw(shapes)
        strides = draw(st.lists(st.integers(1, 6), min_size=len(shape), max_size=len(shape)))
        operation = draw(st.sampled_from(["all_reduce", FUSED]))
        dtype = draw(st.sampled_from(DTYPES))
        weight = draw(st.sampled_from([*WEIGHTS, None]))
        epsilon = draw(st.sampled_from([*EPSILONS, None]))
    return operation, tuple(shape), tuple(strides), dtype, weight, epsilon


def build(decls):
    pairs, model = [], {}
    for i, d in enumerate(decls):
        invocation = Invocation(name=f"d{i}", **d)
        plan = object()
        pairs.append((invocation, plan))
        strides = d["strides"] or contiguous(d["shape"])
        key = model_key(
            d["operation"], d["shape"], d["dtype"], strides, d["norm_weight"], d["epsilon"]
        )
        model.setdefault(key, plan)
    return pairs, model


@SETTINGS
@given(data=st.data(), decls=st.lists(declarations(), max_size=12))
def test_index_agrees_with_a_dict_model(data, decls):
    pairs, model = build(decls)
    index = DeclaredPlanIndex(pairs)
    assert len(index) == len(model)
    for _ in range(8):
        operation, shape, strides, dtype, weight, epsilon = data.draw(probes(decls))
        tensor = torch.empty_strided(shape, strides, dtype=dtype)
        expected = model.get(model_key(operation, shape, dtype, strides, weight, epsilon))
        assert index.lookup(tensor, operation, weight, epsilon) is expected
        assert index.has_plan_for(tensor, operation, weight, epsilon) is (expected is not None)
        if expected is None:
            with pytest.raises(UndeclaredPlanError):
                index.plan_for(tensor, operation, weight, epsilon)
        else:
            assert index.plan_for(tensor, operation, weight, epsilon) is expected
    # probing inserted nothing
    assert len(index) == len(model)


@SETTINGS
@given(before=st.lists(declarations(), max_size=8), after=st.lists(declarations(), max_size=8))
def test_rebuild_is_the_same_as_a_fresh_build(before, after):
    index = DeclaredPlanIndex(build(before)[0])
    pairs, model = build(after)
    index.rebuild(pairs)
    assert len(index) == len(model)
    assert [p for _, p in index.declared()] == [p for _, p in pairs]
    for d in after:
        tensor = torch.empty_strided(
            d["shape"], d["strides"] or contiguous(d["shape"]), dtype=d["dtype"]
        )
        key = model_key(
            d["operation"],
            d["shape"],
            d["dtype"],
            tensor.stride(),
            d["norm_weight"],
            d["epsilon"],
        )
        assert index.lookup(tensor, d["operation"], d["norm_weight"], d["epsilon"]) is model[key]
