"""The declared-plan index: the seed's qualifying tests (spec §10 items 1-6) and more."""

from __future__ import annotations

import gc
import sys
import threading
import weakref

import b12x
import numpy as np
import pytest
import torch
from b12x.comm.pcie import DeclaredPlanIndex, Invocation, UndeclaredPlanError

FUSED = "all_reduce_fused_add_rms_norm"


def inv(name, shape=(2, 4), dtype=torch.bfloat16, strides=None, **kw):
    return Invocation(
        name=name, operation="all_reduce", shape=shape, dtype=dtype, strides=strides, **kw
    )


def fused_inv(name, weight, epsilon, shape=(2, 4)):
    return Invocation(
        name=name,
        operation=FUSED,
        shape=shape,
        dtype=torch.bfloat16,
        norm_weight=weight,
        epsilon=epsilon,
    )


def index_of(*invocations):
    """An index whose plan for each invocation is its name."""
    return DeclaredPlanIndex([(i, i.name) for i in invocations])


# --- §10.1: weights by identity, epsilon, dtype, shape, strides ---


def test_fused_declarations_are_told_apart_by_weight_identity_and_epsilon():
    weight_a = torch.ones(4)
    weight_b = weight_a.clone()  # equal value, another object
    index = index_of(
        fused_inv("a", weight_a, 1e-6),
        fused_inv("b", weight_b, 1e-6),
        fused_inv("epsilon", weight_a, 1e-5),
    )
    t = torch.empty((2, 4), dtype=torch.bfloat16)
    assert index.lookup(t, FUSED, weight_a, 1e-6) == "a"
    assert index.lookup(t, FUSED, weight_b, 1e-6) == "b"
    assert index.lookup(t, FUSED, weight_a, 1e-5) == "epsilon"
    assert not index.has_plan_for(t)  # the plain operation
    assert not index.has_plan_for(t, FUSED, weight_a.clone(), 1e-6)
    assert not index.has_plan_for(t, FUSED, weight_a, 1e-4)
    assert not index.has_plan_for(t, FUSED, weight_a)  # no epsilon
    assert not index.has_plan_for(t, FUSED, None, 1e-6)  # no weight
    assert index.has_plan_for(t, operation=FUSED, weight=weight_b, epsilon=1e-6)


# --- §10.2: shape, dtype, strides, first match ---


def test_shape_dtype_strides_and_first_match():
    index = index_of(
        inv("first"),
        inv("equivalent", strides=(4, 1)),
        inv("strided", strides=(8, 1)),
    )
    assert len(index) == 2  # "equivalent" has the key of "first"
    contiguous = torch.empty((2, 4), dtype=torch.bfloat16)
    assert index.lookup(contiguous) == "first"
    view = torch.empty((2, 8), dtype=torch.bfloat16)[:, :4]
    assert view.stride() == (8, 1)
    assert index.lookup(view) == "strided"
    assert index.lookup(contiguous.float()) is None
    assert index.lookup(contiguous.flatten()) is None
    assert index.lookup(contiguous.t()) is None  # shape (4, 2)


def test_a_scalar_declaration_matches_a_zero_dim_tensor():
    index = index_of(inv("scalar", shape=(), dtype=torch.float32))
    assert index.lookup(torch.tensor(1.0)) == "scalar"
    assert index.lookup(torch.tensor([1.0])) is None


def test_lookup_returns_the_declared_plan_object_itself():
    plan = object()
    index = DeclaredPlanIndex([(inv("p"), plan)])
    assert index.lookup(torch.empty((2, 4), dtype=torch.bfloat16)) is plan
    assert index.plan_for(torch.empty((2, 4), dtype=torch.bfloat16)) is plan


# --- §10.3: a rebuild replaces a snapshot ---


def test_the_index_is_a_snapshot_until_rebuilt():
    pairs = [(inv("first"), "first")]
    index = DeclaredPlanIndex(pairs)
    t = torch.empty((2, 4), dtype=torch.bfloat16)
    pairs.clear()  # the declarations it was built from change...
    assert index.lookup(t) == "first"  # ...the index does not
    index.rebuild(pairs)
    assert index.lookup(t) is None
    assert len(index) == 0


def test_rebuild_replaces_everything_at_once_and_a_bad_pair_changes_nothing():
    index = index_of(inv("old", shape=(3,)))
    index.rebuild([(inv("new", shape=(5,)), "new")])
    assert index.lookup(torch.empty(3, dtype=torch.bfloat16)) is None
    assert index.lookup(torch.empty(5, dtype=torch.bfloat16)) == "new"
    with pytest.raises(
        b12x.ArgumentTypeError,
        match=r"^DeclaredPlanIndex.rebuild: pairs\[1\] expected an \(invocation, plan\) tuple",
    ):
        index.rebuild([(inv("x", shape=(7,)), "x"), "not a pair"])
    with pytest.raises(b12x.ArgumentTypeError, match=r"pairs\[0\] .* tuple, got list"):
        index.rebuild([[inv("x", shape=(7,)), "x"]])  # a pair given as a list
    assert index.lookup(torch.empty(5, dtype=torch.bfloat16)) == "new"
    assert [(i.name, p) for i, p in index.declared()] == [("new", "new")]


@pytest.mark.parametrize("pairs", [5, 1.5, object()])
def test_pairs_that_are_no_iterable_are_a_b12x_error_naming_them(pairs):
    with pytest.raises(
        b12x.ArgumentTypeError,
        match=r"^DeclaredPlanIndex: pairs expected an iterable of \(invocation, plan\) tuples",
    ):
        DeclaredPlanIndex(pairs)
    with pytest.raises(b12x.ArgumentTypeError, match=r"^DeclaredPlanIndex.rebuild: pairs"):
        DeclaredPlanIndex().rebuild(pairs)


def test_clear_empties_the_index():
    index = index_of(inv("a"))
    index.clear()
    assert len(index) == 0
    assert index.declared() == []
    assert not index.has_plan_for(torch.empty((2, 4), dtype=torch.bfloat16))


# --- §10.4: undeclared shapes are rejected, the index stays bounded ---


def test_undeclared_shapes_are_rejected_and_never_cached():
    empty = DeclaredPlanIndex()
    some = index_of(inv("a"), inv("b", shape=(3, 4)))
    for rows in range(1, 65):
        t = torch.empty((rows, 4), dtype=torch.bfloat16)
        assert not empty.has_plan_for(t)
        with pytest.raises(UndeclaredPlanError, match="no declared plan"):
            empty.plan_for(t)
        if rows not in (2, 3):
            assert some.lookup(t) is None
    assert len(empty) == 0
    assert len(some) == 2
    assert len(some.declared()) == 2


def test_undeclared_plan_error_is_a_runtime_error_naming_the_call_and_a_bounded_list():
    index = index_of(*[inv(f"r{r}", shape=(r, 16)) for r in range(1, 41)])
    t = torch.empty((64, 32), dtype=torch.float16)[:, :16]
    with pytest.raises(UndeclaredPlanError) as info:
        index.plan_for(t)
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert msg.startswith(
        "DeclaredPlanIndex.plan_for: no declared plan for all_reduce on shape (64, 16) "
        "float16 strides (32, 1); declared (40): 'r1' all_reduce(1, 16) bfloat16"
    )
    assert "'r16' all_reduce(16, 16) bfloat16 strides (16, 1)" in msg
    assert "'r17'" not in msg
    assert msg.endswith(", ... and 24 more")


def test_undeclared_fused_call_names_weight_and_epsilon():
    w = torch.ones(4)
    index = index_of(fused_inv("f", w, 1e-6))
    with pytest.raises(UndeclaredPlanError, match=r"with norm weight id 0x[0-9a-f]+ epsilon 1e-5"):
        index.plan_for(torch.empty((2, 4), dtype=torch.bfloat16), FUSED, w, 1e-5)


# --- §10.5: singleton strides ---


@pytest.mark.parametrize("declared_strides", [None, (8, 1)])
@pytest.mark.parametrize(
    ("shape", "live_strides", "accepted"),
    [
        ((1, 8), (10, 1), True),
        ((2, 8), (8, 1), True),
        ((2, 8), (10, 1), False),
        ((1, 8), (8, 2), False),
    ],
)
def test_singleton_strides(declared_strides, shape, live_strides, accepted):
    index = DeclaredPlanIndex([(inv("p", shape=shape, strides=declared_strides), "plan")])
    t = torch.empty_strided(shape, live_strides, dtype=torch.bfloat16)
    assert index.has_plan_for(t) is accepted
    if accepted:
        assert index.plan_for(t) == "plan"
    else:
        with pytest.raises(UndeclaredPlanError):
            index.plan_for(t)


# --- §10.6: plan_for on an empty index ---


def test_plan_for_on_an_empty_index_raises():
    with pytest.raises(UndeclaredPlanError, match=r"no declared plan for .*; nothing is declared"):
        DeclaredPlanIndex().plan_for(torch.empty((2, 4), dtype=torch.bfloat16))


# --- bad input: a clear TypeError from lookup, False from has_plan_for ---

W = torch.ones(4)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((None,), b12x.NotATensorError, "tensor expected a tensor .* got NoneType"),
        (([2, 4],), b12x.NotATensorError, "tensor expected a tensor .* got list"),
        (
            (np.zeros((4, 4), dtype=np.float32)[::-1],),
            b12x.UnsupportedTensorError,
            r"tensor expected non-negative strides, got shape \(4, 4\) strides \(-4, 1\)",
        ),
        (
            (torch.empty((0, 4), dtype=torch.bfloat16),),
            b12x.UnsupportedTensorError,
            r"tensor expected a tensor with at least one element, got shape \(0, 4\)",
        ),
        (
            (torch.empty((2, 4), dtype=torch.bfloat16), FUSED, [1.0] * 4, 1e-6),
            b12x.NotATensorError,
            "weight expected a tensor .* got list",
        ),
        (
            (torch.empty((2, 4), dtype=torch.bfloat16), FUSED, W, "tiny"),
            b12x.ArgumentTypeError,
            r"epsilon expected a real number \(not a bool\), got 'tiny'",
        ),
        (
            (torch.empty((2, 4), dtype=torch.bfloat16), FUSED, W, True),
            b12x.ArgumentTypeError,
            r"epsilon expected a real number \(not a bool\), got True",
        ),
        ((torch.empty(2), 5), b12x.ArgumentTypeError, "operation expected 'all_reduce' .* got 5"),
        ((torch.empty(2), "all_gather"), b12x.ConfigError, "got 'all_gather'"),
    ],
)
def test_bad_input_to_lookup(args, error, match):
    index = index_of(inv("a"), fused_inv("f", W, 1e-6))
    with pytest.raises(error, match=match) as info:
        index.lookup(*args)
    assert str(info.value).startswith("DeclaredPlanIndex.lookup: ")
    with pytest.raises(error):
        index.plan_for(*args)
    assert index.has_plan_for(*args) is False
    assert len(index) == 2
    if error is not b12x.ConfigError:
        assert issubclass(error, TypeError)


def test_weird_objects_never_make_has_plan_for_raise():
    class Broken(torch.Tensor):
        @property
        def shape(self):
            raise RuntimeError("no shape today")

    broken = torch.empty(2).as_subclass(Broken)
    index = index_of(inv("a"))
    for obj in (object(), "tensor", 1.5, broken, torch.empty((1,) * 9)):
        assert index.has_plan_for(obj) is False
    with pytest.raises(RuntimeError, match="no shape today"):
        index.lookup(broken)
    assert index.lookup(torch.empty((1,) * 9)) is None  # rank beyond any declaration: a miss


# --- other tensors and other callers ---


def test_dlpack_producers_and_tensor_subclasses_are_looked_up():
    index = index_of(
        inv("half", shape=(2, 4), dtype=torch.float16), inv("f32", shape=(3,), dtype=torch.float32)
    )
    assert index.lookup(np.zeros((2, 4), dtype=np.float16)) == "half"
    assert index.lookup(np.zeros((2, 8), dtype=np.float16)[:, :4]) is None
    assert index.lookup(torch.nn.Parameter(torch.zeros(3))) == "f32"


def test_the_index_holds_declared_weights_until_cleared():
    weight = torch.ones(4)
    alive = weakref.ref(weight)
    index = DeclaredPlanIndex([(fused_inv("f", weight, 1e-6), "plan")])
    key_id = id(weight)
    del weight
    gc.collect()
    assert alive() is not None  # so its id() cannot be taken by another object
    assert id(alive()) == key_id
    assert index.lookup(torch.empty((2, 4), dtype=torch.bfloat16), FUSED, alive(), 1e-6) == "plan"
    index.clear()
    gc.collect()
    assert alive() is None


def test_reference_cycles_through_plans_are_collected():
    class Plan:
        pass

    plan = Plan()
    index = DeclaredPlanIndex([(inv("a"), plan)])
    plan.index = index  # plan -> index -> plan
    alive = weakref.ref(plan)
    del plan, index
    gc.collect()
    assert alive() is None


def test_repr_counts_keys_and_declarations():
    index = index_of(inv("a"), inv("b"), inv("c", shape=(3, 4)))
    assert repr(index) == "DeclaredPlanIndex(2 keys from 3 declarations)"
    assert [i.name for i, _ in index.declared()] == ["a", "b", "c"]


def test_readers_see_whole_snapshots_while_another_thread_rebuilds():
    """Generation g declares rows g+1..g+8 with plan g; a reader's lookups
    never see a generation older than one it has seen."""

    def generation(g):
        return [(inv(f"g{g}r{r}", shape=(r, 4)), g) for r in range(g + 1, g + 9)]

    index = DeclaredPlanIndex(generation(0))
    stop = threading.Event()
    errors = []

    def reader():
        last = 0
        while not stop.is_set():
            for _, g in index.declared()[:1]:
                plan = index.lookup(torch.empty((g + 4, 4), dtype=torch.bfloat16))
                if plan is not None and plan < last:
                    errors.append((last, plan))
                last = max(last, g)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=reader) for _ in range(2)]
        for t in threads:
            t.start()
        for g in range(1, 200):
            index.rebuild(generation(g))
        stop.set()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []
    assert {g for _, g in index.declared()} == {199}
