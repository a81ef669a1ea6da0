"""CPU tests of the IPC all-reduce's host logic: byte sizes, limits, routing,
plan preparation and sharing (no GPU, no process group)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from b12x import _core
from b12x._core import DeclaredPlanIndex
from b12x.comm import pcie as ar
from b12x.comm.local_group import NVLS_OFF, free_port, init_local_group
from b12x.comm.pcie import knobs
from b12x.errors import ConfigError, UndeclaredPlanError


def route(*declaration):
    """The route of a declaration, or None when it declines."""
    return ar.route(*declaration)[0]


def prepare(invocations, world, limits, multiprocessors=132, twoshot_push=False):
    """``(routed, declined)`` of declaring ``invocations`` (b12x's one declaring path)."""
    plans = ar.DeclaredPlans(
        world, limits, multiprocessors=multiprocessors, twoshot_push=twoshot_push
    )
    declined = plans.declare(invocations)
    return plans.declared_plans, declined


@dataclasses.dataclass(frozen=True)
class Inv:
    """A declared invocation (the fields AllReduce.declare reads)."""

    name: str
    operation: str
    shape: tuple[int, ...]
    dtype: Any
    strides: tuple[int, ...] | None = None
    input_alignment: int = 16
    norm_weight: Any = None
    epsilon: float | None = None
    channel_id: str | None = None
    persistent_input: Any = None


# ------------------------------------------------------------- byte sizes
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("17", 17),
        ("84KB", 86016),
        ("6 MiB", 6291456),
        ("2g", 2**31),
        ("  768kb ", 786432),
        ("3T", 3 << 40),
        ("5b", 5),
        ("+1m", 1 << 20),
        ("-4k", -4096),
    ],
)
def test_parse_byte_size(text, value):
    assert knobs.parse_byte_size(text) == value


@pytest.mark.parametrize("text", ["5x", "5ki", "4 kbb", "7 mibs", "1q"])
def test_bad_suffix_is_a_value_error(text):
    with pytest.raises(ConfigError, match="invalid byte-size suffix"):
        knobs.parse_byte_size(text)
    with pytest.raises(ValueError):
        knobs.parse_byte_size(text)


@pytest.mark.parametrize("text", ["", "KB", "1.5k", "1 2", "0x10", "-", "k5"])
def test_not_a_size(text):
    with pytest.raises(ConfigError, match="invalid byte size"):
        knobs.parse_byte_size(text)


# ------------------------------------------------------------- limits
def test_limits_defaults_and_env():
    assert ar.Limits.from_env({}) == ar.Limits()
    env = {
        knobs.ENV_ONESHOT_MAX: "16KB",
        knobs.ENV_FUSED_MAX: "72KB",
        knobs.ENV_TWOSHOT_MAX: "768KB",
        knobs.ENV_TWOSHOT_ROW_ELEMS: "896",
    }
    limits = ar.Limits.from_env(env)
    assert limits == ar.Limits(16384, 73728, 786432, 896)
    assert limits.slot_bytes() == 786432
    assert limits.slot_bytes(twoshot_push=True) == 2 * 786432


@pytest.mark.parametrize("off", ["", "0", "off", "none", "Disabled"])
def test_twoshot_off_values(off):
    assert ar.Limits.from_env({knobs.ENV_TWOSHOT_MAX: off}).twoshot_max == 0


def test_one_shot_zero_disables_and_negative_is_rejected():
    limits = ar.Limits.from_env({knobs.ENV_ONESHOT_MAX: "0"})
    assert limits.oneshot_max == 0
    assert route(ar.PLAIN, (8,), torch.bfloat16, None, 2, limits) is None
    with pytest.raises(ValueError, match="non-negative"):
        ar.Limits.from_env({knobs.ENV_FUSED_MAX: "-1"})
    with pytest.raises(ValueError):
        ar.Limits.from_env({knobs.ENV_TWOSHOT_MAX: "-1"})
    with pytest.raises(ValueError):
        ar.Limits(oneshot_max=-1)


# ------------------------------------------------------------- routing
TP2 = ar.Limits(oneshot_max=16 << 10, fused_max=72 << 10, twoshot_max=0)
TP4 = ar.Limits(oneshot_max=16 << 10, fused_max=16 << 10, twoshot_max=768 << 10)


def test_oneshot_ceiling_is_inclusive():
    assert route(ar.PLAIN, (1, 8192), torch.bfloat16, None, 2, TP2) == "oneshot"
    assert route(ar.PLAIN, (1, 8200), torch.bfloat16, None, 2, TP2) is None
    assert route(ar.PLAIN, (1, 6144), torch.bfloat16, None, 2, TP2) == "oneshot"


def test_reference_tp2_case_routes():
    # (1, 6144) plain one-shot, (4, 6144) fused, (4, 6144) plain declines (48 KB)
    assert route(ar.PLAIN, (1, 6144), torch.bfloat16, None, 2, TP2) == "oneshot"
    assert route(ar.FUSED, (4, 6144), torch.bfloat16, None, 2, TP2) == "oneshot_fused"
    name, why = ar.route(ar.PLAIN, (4, 6144), torch.bfloat16, None, 2, TP2)
    assert name is None and "two-shot" in why


def test_reference_tp4_twoshot_window():
    assert route(ar.PLAIN, (12, 5120), torch.bfloat16, None, 4, TP4) is None
    assert route(ar.PLAIN, (16, 5120), torch.bfloat16, None, 4, TP4) == "twoshot"
    assert route(ar.PLAIN, (64, 4096), torch.bfloat16, None, 4, TP4) == "twoshot"
    # one-shot keeps priority below its ceiling; above the window nothing routes
    assert route(ar.PLAIN, (2, 4096), torch.bfloat16, None, 4, TP4) == "oneshot"
    assert route(ar.PLAIN, (256, 4096), torch.bfloat16, None, 4, TP4) is None
    # two-shot is bf16 only and contiguous only
    assert route(ar.PLAIN, (16, 5120), torch.float16, None, 4, TP4) is None
    assert route(ar.PLAIN, (16, 5120), torch.bfloat16, (1, 16), 4, TP4) is None


def test_fused_has_an_independent_ceiling():
    limits = ar.Limits(oneshot_max=16, fused_max=64, twoshot_max=0)
    assert route(ar.PLAIN, (2, 4), torch.float32, None, 2, limits) is None
    assert route(ar.FUSED, (2, 4), torch.float32, None, 2, limits) == "oneshot_fused"
    assert route(ar.FUSED, (2, 8), torch.float32, None, 2, limits) == "oneshot_fused"
    assert route(ar.FUSED, (4, 8), torch.float32, None, 2, limits) is None


@pytest.mark.parametrize("world", range(2, 9))
def test_every_world_size_routes(world):
    assert route(ar.PLAIN, (64,), torch.float16, None, world, TP4) == "oneshot"
    numel = world * 4096 * 4
    assert route(ar.PLAIN, (numel,), torch.bfloat16, None, world, TP4) == "twoshot"


@pytest.mark.parametrize("world", [1, 9, 16])
def test_unsupported_world_sizes_decline(world):
    name, why = ar.route(ar.PLAIN, (64,), torch.float16, None, world, TP4)
    assert name is None and "world size" in why


def test_unsupported_dtypes_and_odd_sizes_decline():
    for dtype in (torch.int32, torch.float64, torch.float8_e4m3fn):
        assert route(ar.PLAIN, (64,), dtype, None, 2, TP2) is None
    name, why = ar.route(ar.PLAIN, (3,), torch.float32, None, 2, TP2)
    assert name is None and "multiple of 16" in why
    # fused rows must be whole 16-byte packs, at most 64 KiB
    assert route(ar.FUSED, (2, 7), torch.bfloat16, None, 2, TP2) is None
    big = ar.Limits(fused_max=1 << 30)
    assert route(ar.FUSED, (1, 32768), torch.bfloat16, None, 2, big) == "oneshot_fused"
    assert route(ar.FUSED, (1, 32776), torch.bfloat16, None, 2, big) is None


def test_strides_and_singletons():
    r = lambda shape, strides: route(ar.PLAIN, shape, torch.bfloat16, strides, 2, TP2)  # noqa: E731
    assert r((1, 8), (10, 1)) == "oneshot"  # a padded singleton row is still dense
    assert r((2, 8), (10, 1)) is None  # padded rows are not
    assert r((8, 2), (1, 8)) == "oneshot"  # transposed but dense: elementwise is fine
    assert route(ar.FUSED, (8, 2), torch.float32, (1, 8), 2, TP2) is None


def test_unknown_operation_is_a_config_error():
    with pytest.raises(ConfigError, match="operation"):
        route("all_gather", (8,), torch.bfloat16, None, 2, TP2)


# ------------------------------------------------------------- preparation
def test_equal_declarations_share_one_plan():
    weight = torch.ones(6144, dtype=torch.bfloat16)
    alternate = weight.flip(0)
    invs = []
    for layer in range(40):
        invs += [
            Inv(f"l{layer}.plain", ar.PLAIN, (1, 6144), torch.bfloat16),
            Inv(
                f"l{layer}.fused",
                ar.FUSED,
                (4, 6144),
                torch.bfloat16,
                norm_weight=weight if layer % 2 == 0 else alternate,
                epsilon=1e-6,
            ),
            Inv(f"l{layer}.big", ar.PLAIN, (16, 4096), torch.bfloat16),
        ]
    routed, declined = prepare(invs, 2, TP2, multiprocessors=132)
    assert [inv.name for inv, _ in declined] == [f"l{i}.big" for i in range(40)]
    plain = {id(p) for inv, p in routed if inv.operation == ar.PLAIN}
    fused = {id(p) for inv, p in routed if inv.operation == ar.FUSED}
    assert len(plain) == 1 and len(fused) == 1 and plain != fused
    assert len(routed) == 80


def _plan(operation, shape, dtype, world=2, sms=132, limits=None, push=False):
    """The plan declare() prepares for one declaration."""
    limits = (
        ar.Limits(oneshot_max=1 << 30, fused_max=1 << 30, twoshot_max=0)
        if limits is None
        else limits
    )
    norm = {}
    if operation == ar.FUSED:
        norm = {"norm_weight": torch.ones(shape[-1], dtype=dtype), "epsilon": 1e-6}
    routed, declined = prepare(
        [Inv("p", operation, shape, dtype, **norm)], world, limits, sms, twoshot_push=push
    )
    assert not declined, declined
    return routed[0][1]


def test_plans_carry_route_kernel_and_resident_geometry():
    p = _plan(ar.PLAIN, (1, 8192), torch.bfloat16)
    assert (p.route, p.dtype, p.nbytes, p.kernel) == (
        "oneshot",
        "bfloat16",
        16384,
        "b12x_allreduce_oneshot_bf16",
    )
    f = _plan(ar.FUSED, (16, 7168), torch.bfloat16)
    assert f.geometry == (16, 896, 1) and f.kernel == "b12x_allreduce_fused_bf16_p1"
    f32 = _plan(ar.FUSED, (3, 7168), torch.float32, world=8)
    assert f32.geometry == (3, 1024, 2)
    push = prepare(
        [Inv("t", ar.PLAIN, (64, 4096), torch.bfloat16)], 2, TP4, 132, twoshot_push=True
    )[0]
    assert push[0][1].twoshot_push and push[0][1].kernel == "b12x_allreduce_twoshot_push_bf16"
    pull = prepare([Inv("t", ar.PLAIN, (64, 4096), torch.bfloat16)], 2, TP4, 132)
    assert pull[0][0][1].kernel == "b12x_allreduce_twoshot_bf16"
    two = ar.Limits(oneshot_max=0, fused_max=0, twoshot_max=32 << 20)
    for world in (2, 4, 8):
        t = _plan(ar.PLAIN, (4096, 4096), torch.bfloat16, world=world, sms=36, limits=two)
        grid, block, _ = t.geometry
        assert 1 <= grid <= 36 and block == 512
    assert "twoshot" in repr(t)
    # no two-shot kernel for float16, and no operation but the two declared ones
    _, declined = prepare([Inv("h", ar.PLAIN, (64,), torch.float16)], 2, two, 132)
    assert "bfloat16" in declined[0][1]
    with pytest.raises(ConfigError, match="operation"):
        prepare([Inv("d", "dma", (64,), torch.bfloat16)], 2, two, 132)
    with pytest.raises(TypeError):
        _core.AllReducePlan("oneshot", [1, 8192], "bfloat16", 2, 132)  # only declare() makes plans


def test_plans_stage_what_the_slot_holds():
    """The one slot rule: the push two-shot stages twice its bytes, and every
    plan the limits route fits the slot those limits size."""
    limits = ar.Limits(
        oneshot_max=16 << 10, fused_max=72 << 10, twoshot_max=768 << 10, twoshot_row_elems=8
    )
    for push in (False, True):
        slot = limits.slot_bytes(twoshot_push=push)
        for world in (2, 4, 8):
            for n in (16, 4096, 64 << 10, 768 << 10):
                plan = _plan(ar.PLAIN, (n // 2,), torch.bfloat16, world, limits=limits, push=push)
                assert plan.staged_bytes <= slot + 256, (plan, slot)
                expect = 2 * n if plan.twoshot_push else n
                assert plan.staged_bytes == expect and plan.world == world


# ------------------------------------------------------------- lookup keys
def _index(routed):
    return DeclaredPlanIndex(routed)


def test_fused_key_is_weight_identity_and_epsilon():
    a = torch.ones(4, dtype=torch.bfloat16)
    b = a.clone()
    invs = [
        Inv("a", ar.FUSED, (2, 4), torch.bfloat16, norm_weight=a, epsilon=1e-6),
        Inv("b", ar.FUSED, (2, 4), torch.bfloat16, norm_weight=b, epsilon=1e-6),
        Inv("eps", ar.FUSED, (2, 4), torch.bfloat16, norm_weight=a, epsilon=1e-5),
    ]
    plans = [object(), object(), object()]
    index = _index(list(zip(invs, plans, strict=True)))
    x = torch.empty(2, 4, dtype=torch.bfloat16)
    assert index.lookup(x, ar.FUSED, a, 1e-6) is plans[0]
    assert index.lookup(x, ar.FUSED, b, 1e-6) is plans[1]
    assert index.lookup(x, ar.FUSED, a, 1e-5) is plans[2]
    assert index.lookup(x, ar.PLAIN, None, None) is None
    assert index.lookup(x, ar.FUSED, a.clone(), 1e-6) is None
    assert index.lookup(x, ar.FUSED, a, 1e-4) is None


def test_first_declaration_wins_and_strides_matter():
    invs = [
        Inv("first", ar.PLAIN, (2, 4), torch.bfloat16),
        Inv("equivalent", ar.PLAIN, (2, 4), torch.bfloat16, strides=(4, 1)),
        Inv("strided", ar.PLAIN, (2, 4), torch.bfloat16, strides=(8, 1)),
    ]
    index = _index([(inv, inv.name) for inv in invs])
    x = torch.empty(2, 4, dtype=torch.bfloat16)
    assert index.lookup(x, ar.PLAIN, None, None) == "first"
    assert index.lookup(torch.empty(2, 8, dtype=torch.bfloat16)[:, :4], ar.PLAIN, None, None) == (
        "strided"
    )
    assert index.lookup(x.float(), ar.PLAIN, None, None) is None
    assert index.lookup(x.reshape(8), ar.PLAIN, None, None) is None
    assert len(index) == 2


def test_singleton_strides_are_normalised():
    for declared in (None, (8, 1)):
        index = _index([(Inv("x", ar.PLAIN, (1, 8), torch.bfloat16, strides=declared), "plan")])
        padded = torch.empty(1, 10, dtype=torch.bfloat16)[:, :8]  # strides (10, 1)
        assert index.lookup(padded, ar.PLAIN, None, None) == "plan"
        other = torch.empty(1, 16, dtype=torch.bfloat16)[:, ::2]  # strides (16, 2)
        assert index.lookup(other, ar.PLAIN, None, None) is None


def test_undeclared_lookups_never_insert():
    index = _index([])
    for rows in range(1, 65):
        assert (
            index.lookup(torch.empty(rows, 4, dtype=torch.bfloat16), ar.PLAIN, None, None) is None
        )
    assert len(index) == 0
    assert not index.has_plan_for(torch.empty(3, 4))
    assert not index.has_plan_for("not a tensor")
    with pytest.raises(UndeclaredPlanError, match="no declared plan for all_reduce on shape"):
        index.plan_for(torch.empty(3, 4))


# ------------------------------------------------------------- collective setup (gloo, CPU)
def _gloo_setup_worker(rank, world, port, outdir):
    import json
    import os
    from pathlib import Path

    import torch.distributed as dist

    os.environ["B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK"] = "1"
    init_local_group(rank, world, port, backend="gloo")
    from b12x.comm.pcie.allreduce import AllReduce

    runtime = AllReduce(device=0)  # no GPU needed: setup fails before touching one
    runtime.declare([Inv("x", ar.PLAIN, (8,), torch.float32)])
    result = {
        "enabled": runtime.enabled,
        "reason": runtime.disabled_reason,
        "has_plan": runtime.plans.has_plan_for(torch.empty(8)),
        "nvls_off": all(os.environ.get(k) == v for k, v in NVLS_OFF.items()),
    }
    runtime.close()
    runtime.close()
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()  # neither rank tears gloo down while the other still uses it
    dist.destroy_process_group()
    # Skip interpreter teardown: gloo's static destructors sometimes abort at
    # exit ("terminate called without an active exception"), after the
    # result above is written.
    os._exit(0)


def test_a_setup_failure_on_one_rank_disables_every_rank(tmp_path):
    """Without a driver every rank fails 'validate'; with one, rank 1's test hook
    fails 'allocate'. Either way no rank enables the runtime."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_gloo_setup_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        r = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert r["enabled"] is False and r["has_plan"] is False, r
        assert "failed on rank(s)" in r["reason"] and "1" in r["reason"], r
        assert r["nvls_off"], "init_local_group keeps NVLink multicast off"


# ------------------------------------------------------------- declare -> lookup wiring
def _stand_in(world: int = 2, limits: ar.Limits = TP2) -> ar.AllReduce:
    """An enabled AllReduce without a group or a GPU (its host stand-in)."""
    return ar.AllReduce.host_stand_in(world, limits=limits)


def test_declare_indexes_routed_plans_and_declines_the_rest():
    weight = torch.ones(6144, dtype=torch.bfloat16)
    runtime = _stand_in()
    runtime.declare(
        [
            Inv("one", ar.PLAIN, (1, 6144), torch.bfloat16),
            Inv("big", ar.PLAIN, (16, 4096), torch.bfloat16),
            Inv("fused", ar.FUSED, (4, 6144), torch.bfloat16, norm_weight=weight, epsilon=1e-6),
        ]
    )
    plans = runtime.plans
    assert [inv.name for inv, _ in plans.declared_plans] == ["one", "fused"]
    one = torch.empty(1, 6144, dtype=torch.bfloat16)
    assert plans.has_plan_for(one)
    assert plans.plan_for(one).route == "oneshot"
    x = torch.empty(4, 6144, dtype=torch.bfloat16)
    assert plans.plan_for(x, ar.FUSED, weight, 1e-6).route == "oneshot_fused"
    assert not plans.has_plan_for(x)  # plain (4, 6144) declined: NCCL takes it
    assert not plans.has_plan_for(torch.empty(16, 4096, dtype=torch.bfloat16))
    with pytest.raises(UndeclaredPlanError, match="no declared plan for"):
        plans.plan_for(x)
    # a refresh replaces the declarations wholesale
    runtime.declare([])
    assert not plans.has_plan_for(one)
    assert "plans=0" in repr(runtime)


def test_a_disabled_runtime_declines_everything():
    runtime = _stand_in()
    runtime.declare([Inv("one", ar.PLAIN, (1, 6144), torch.bfloat16)])
    one = torch.empty(1, 6144, dtype=torch.bfloat16)
    assert runtime.admit(one) is not None
    runtime._disable("setup step 'allocate' failed on rank(s) [1]")
    assert runtime.admit(one) is None
    with pytest.raises(UndeclaredPlanError, match="disabled"):
        runtime.all_reduce(one)
    runtime.declare([Inv("one", ar.PLAIN, (1, 6144), torch.bfloat16)])
    assert runtime.plans.declared_plans == [] and not runtime.plans.has_plan_for(one)
