"""The PCIe all-reduce adapter: the seed's qualifying tests (spec §10 items 1-7).

Items 1-6 go through the ``DeclaredPlanIndex`` of the adapter's declared plans
(without a runtime: a ``b12x.comm.pcie.DeclaredPlans``). Item 7: dispatch,
admission, capture and describers against b12x's own runtime over its host
stand-in, whose device side records every call (the real one needs GPUs);
routing and limits through the runtime's own rules and ``Limits`` (its own
tests cover the routing table and the byte parser).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import sys

import b12x
import pytest
import torch
from b12x.comm import pcie as pcie_module
from b12x.comm.pcie import Limits
from b12x.integration.vllm import PcieAllReduce, add_rms_norm_
from b12x.integration.vllm import allreduce as allreduce_mod
from b12x.integration.vllm.allreduce import FUSED, PLAIN
from vllm_fakes import FakeRuntime

CPU = torch.device("cpu")


@pytest.fixture
def pcie():
    return pcie_module


def inv(pcie, name, shape, dtype=torch.bfloat16, strides=None, weight=None, epsilon=None):
    operation = FUSED if weight is not None else PLAIN
    return pcie.Invocation(
        name=name,
        operation=operation,
        shape=tuple(shape),
        dtype=dtype,
        strides=strides,
        norm_weight=weight,
        epsilon=epsilon,
    )


def pairs_of(*invocations):
    """``(invocation, plan)`` pairs, each invocation with a plan object of its own."""
    return [(i, f"plan:{i.name}") for i in invocations]


def indexed(*invocations):
    """An adapter whose declared plans hold ``invocations``, each with its own plan object."""
    comm = PcieAllReduce(device=CPU, limits=Limits())  # no runtime: the declared plans alone
    comm.plans.index.rebuild(pairs_of(*invocations))
    return comm


# --- items 1-6: the declared-plan index through the adapter ---------------------------------


def test_item1_fused_keys_use_weight_identity_and_epsilon(pcie):
    weight_a = torch.ones(4, dtype=torch.bfloat16)
    weight_b = weight_a.clone()  # equal value, another object
    comm = indexed(
        inv(pcie, "a", (2, 4), weight=weight_a, epsilon=1e-6),
        inv(pcie, "b", (2, 4), weight=weight_b, epsilon=1e-6),
        inv(pcie, "epsilon", (2, 4), weight=weight_a, epsilon=1e-5),
    )
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    assert comm.plans.plan_for(x, FUSED, weight_a, 1e-6) == "plan:a"
    assert comm.plans.plan_for(x, FUSED, weight_b, 1e-6) == "plan:b"
    assert comm.plans.plan_for(x, FUSED, weight_a, 1e-5) == "plan:epsilon"
    assert not comm.plans.has_plan_for(x)
    assert not comm.plans.has_plan_for(x, FUSED, weight_a.clone(), 1e-6)
    assert not comm.plans.has_plan_for(x, FUSED, weight_a, 1e-4)


def test_item2_shape_dtype_strides_and_first_match(pcie):
    comm = indexed(
        inv(pcie, "first", (2, 4)),
        inv(pcie, "equivalent", (2, 4), strides=(4, 1)),
        inv(pcie, "strided", (2, 4), strides=(8, 1)),
    )
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    assert comm.plans.plan_for(x) == "plan:first"  # first equal key wins
    assert comm.plans.plan_for(torch.empty((2, 8), dtype=torch.bfloat16)[:, :4]) == "plan:strided"
    assert not comm.plans.has_plan_for(x.float())
    assert not comm.plans.has_plan_for(x.reshape(8))


def test_item3_the_index_is_a_snapshot_until_rebuilt(pcie):
    declared = pairs_of(inv(pcie, "first", (2, 4)))
    comm = indexed()
    comm.plans.index.rebuild(declared)
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    declared.clear()
    assert comm.plans.plan_for(x) == "plan:first"
    comm.plans.index.rebuild(declared)
    assert not comm.plans.has_plan_for(x)


def test_item4_undeclared_shapes_are_rejected_and_never_cached(pcie):
    comm = indexed()
    for rows in range(1, 65):
        x = torch.empty((rows, 4), dtype=torch.bfloat16)
        assert not comm.plans.has_plan_for(x)
        with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan"):
            comm.plans.plan_for(x)
    assert len(comm.plans) == 0


@pytest.mark.parametrize("declared", [None, (8, 1)])
def test_item5_size_one_dims_ignore_their_stride(pcie, declared):
    one = inv(pcie, "one", (1, 8), strides=declared)
    two = inv(pcie, "two", (2, 8), strides=declared)
    comm = indexed(one, two)
    storage = torch.empty(64, dtype=torch.bfloat16)

    def live(shape, strides):
        return storage.as_strided(shape, strides)

    assert comm.plans.plan_for(live((1, 8), (10, 1))) == "plan:one"
    assert comm.plans.plan_for(live((2, 8), (8, 1))) == "plan:two"
    assert not comm.plans.has_plan_for(live((2, 8), (10, 1)))
    assert not comm.plans.has_plan_for(live((1, 8), (8, 2)))


def test_item6_plan_for_on_an_empty_communicator_raises(pcie):
    comm = PcieAllReduce(device=CPU, limits=Limits())
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan for"):
        comm.plans.plan_for(x)
    assert not comm.plans.has_plan_for(x)
    assert isinstance(b12x.UndeclaredPlanError("x"), RuntimeError)


# --- item 7: dispatch and admission with a recording runtime ------------------------------


def comm_with(world_size=2, refuse=(), device="cpu"):
    runtime = FakeRuntime.make(world_size=world_size, refuse=refuse, device=device)
    return PcieAllReduce(device=CPU, runtime=runtime), runtime


def plans_by_name(comm):
    return {inv.name: plan for inv, plan in comm.plans.declared_plans}


def test_eager_dispatch_runs_the_declared_call(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "o_proj.m2", (2, 4))])
    x = torch.arange(8, dtype=torch.bfloat16).reshape(2, 4)

    assert comm.should_custom_ar(x)
    out = comm.custom_all_reduce(x)

    assert len(runtime.calls) == 1 and runtime.calls[0] == ("all_reduce", x)
    assert torch.equal(out, x * 2)
    assert comm.plans.routes() == {"o_proj.m2": "oneshot"}
    assert plans_by_name(comm)["o_proj.m2"] is runtime.plans.declared_plans[0][1]
    # the admitted call carries the declared plan: the run never looks it up again
    assert comm.admit(x).plan is plans_by_name(comm)["o_proj.m2"]
    assert runtime.runtime_launches() == 1


def test_fused_runs_in_place_and_only_for_its_declaration(pcie):
    comm, runtime = comm_with(refuse={"plain"})  # the runtime declines the plain one
    weight = torch.ones(4, dtype=torch.float32)
    comm.declare(
        [
            inv(pcie, "plain", (2, 4), dtype=torch.float32),
            inv(pcie, "fused", (2, 4), dtype=torch.float32, weight=weight, epsilon=1e-6),
        ]
    )
    x = torch.ones((2, 4), dtype=torch.float32)
    residual = torch.zeros_like(x)

    assert comm.plans.routes() == {"fused": "oneshot_fused"}
    assert not comm.should_custom_ar(x)
    assert comm.custom_all_reduce(x) is None
    assert comm.try_fused_add_rms_norm(x, residual, weight, 1e-6)
    ((kind, operands),) = runtime.calls
    assert kind == "fused" and all(
        got is want for got, want in zip(operands, (x, residual, weight, x, residual), strict=True)
    )  # in place: out is x, residual_out is residual
    assert not comm.try_fused_add_rms_norm(x, residual, weight, 1e-5)  # undeclared epsilon
    assert not comm.try_fused_add_rms_norm(x, residual, weight.clone(), 1e-6)  # another weight
    assert not comm.try_fused_add_rms_norm(x, x, weight, 1e-6)  # residual aliases the input
    assert not comm.try_fused_add_rms_norm(x, residual.t().contiguous().t(), weight, 1e-6)
    assert not comm.try_fused_add_rms_norm(x, residual, weight.half(), 1e-6)
    assert len(runtime.calls) == 1


def test_runtime_refusal_declines(pcie):
    comm, runtime = comm_with(refuse={"refused"})
    comm.declare([inv(pcie, "refused", (2, 4)), inv(pcie, "kept", (4, 4))])
    assert [i.name for i in runtime.declared[0]] == ["refused", "kept"]
    assert comm.custom_all_reduce(torch.ones((2, 4), dtype=torch.bfloat16)) is None
    assert not comm.should_custom_ar(torch.ones((2, 4), dtype=torch.bfloat16))
    assert comm.should_custom_ar(torch.ones((4, 4), dtype=torch.bfloat16))


def test_live_address_and_device_are_admitted_separately(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 8))])
    storage = torch.ones(40, dtype=torch.bfloat16)
    aligned = storage[:16].view(2, 8)
    misaligned = storage[1:17].view(2, 8)  # same key, address 2 bytes off
    assert comm.should_custom_ar(aligned)
    assert comm.plans.has_plan_for(misaligned)
    assert not comm.should_custom_ar(misaligned)
    assert comm.custom_all_reduce(misaligned) is None
    on_gpu, gpu_runtime = comm_with(device="cuda:0")  # a runtime admits on its own device
    on_gpu.declare([inv(pcie, "m", (2, 8))])
    assert on_gpu.plans.has_plan_for(aligned) and not on_gpu.should_custom_ar(aligned)
    assert runtime.calls == [] and gpu_runtime.calls == []


def test_equal_declarations_share_one_plan(pcie):
    comm, _ = comm_with()
    weight = torch.ones(6144, dtype=torch.bfloat16)
    declared = []
    for layer in range(40):
        declared.append(inv(pcie, f"layers.{layer}.m1", (1, 6144)))
        declared.append(inv(pcie, f"layers.{layer}.fused", (4, 6144), weight=weight, epsilon=1e-6))
    comm.declare(declared)
    plans = plans_by_name(comm)
    plain = {id(plans[f"layers.{i}.m1"]) for i in range(40)}
    fused = {id(plans[f"layers.{i}.fused"]) for i in range(40)}
    assert len(plain) == len(fused) == 1 and plain != fused
    assert len(comm.plans) == 2


def test_all_reduce_raises_on_undeclared(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 4))])
    with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan for"):
        comm.all_reduce(torch.ones((3, 4), dtype=torch.bfloat16))
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    out = torch.empty_like(x)
    assert comm.all_reduce(x, out=out) is out
    assert torch.equal(out, torch.full((2, 4), 2.0, dtype=torch.bfloat16))
    assert len(runtime.calls) == 1 and runtime.calls[0][1] is x


def test_enabled_but_nothing_declared_declines(pcie):
    comm, runtime = comm_with()
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    assert not comm.should_custom_ar(x)
    assert comm.custom_all_reduce(x) is None
    assert not comm.try_fused_add_rms_norm(x, x.clone(), torch.ones(4, dtype=torch.bfloat16), 0.0)
    assert runtime.calls == []


def test_capture_enters_the_runtime_and_restores_state(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 4))])
    with comm.capture():
        assert runtime.in_capture
        comm.custom_all_reduce(torch.ones((2, 4), dtype=torch.bfloat16))
    assert runtime.captures == 1 and not runtime.in_capture
    with pytest.raises(RuntimeError, match="body failed"), comm.capture():
        raise RuntimeError("body failed")
    assert not runtime.in_capture
    assert len(runtime.calls) == 1


def test_capture_with_nothing_declared_is_a_no_op(pcie, caplog):
    # vLLM enters capture() for every TP group at every graph capture, declared or not
    comm, runtime = comm_with()
    with caplog.at_level(logging.INFO, logger=allreduce_mod.logger.name), comm.capture():
        assert not runtime.in_capture
        assert comm.custom_all_reduce(torch.ones((2, 4), dtype=torch.bfloat16)) is None
    assert runtime.captures == 0 and runtime.calls == []
    assert "nothing declared at graph capture" in caplog.text
    disabled = PcieAllReduce(device=CPU, limits=Limits())
    with disabled.capture(stream=None):  # no runtime: a no-op too
        pass


def test_capture_accepts_the_capture_stream(pcie, monkeypatch):
    entered = []

    def stream_scope(stream):
        entered.append(stream)
        return contextlib.nullcontext()

    monkeypatch.setattr(torch.cuda, "stream", stream_scope)
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 4))])
    stream = object()
    with comm.capture(stream=stream):
        assert runtime.in_capture
    with comm.capture():
        pass
    assert entered == [stream] and runtime.captures == 2


def test_fused_fallback_matches_all_reduce_then_add_rms_norm(pcie):
    comm, runtime = comm_with()
    g = torch.Generator().manual_seed(0)
    x = torch.randn((3, 64), generator=g).to(torch.bfloat16)
    residual = torch.randn((3, 64), generator=g).to(torch.bfloat16)
    weight = torch.linspace(0.5, 1.5, 64).to(torch.bfloat16)
    reduced = (x.float() * 2).to(torch.bfloat16)
    r = (reduced.float() + residual.float()).to(torch.bfloat16)
    expected = r.float() * torch.rsqrt(r.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    expected = (expected * weight.float()).to(torch.bfloat16)
    seen = []

    def nccl(t):
        seen.append(t)
        return (t.float() * 2).to(t.dtype)

    comm.fused_all_reduce_add_rms_norm(x, residual, weight, 1e-6, nccl)  # undeclared: fallback

    assert len(seen) == 1 and runtime.calls == []
    assert torch.equal(residual, r)
    torch.testing.assert_close(x, expected, atol=2e-2, rtol=2e-2)

    comm.declare([inv(pcie, "f", (3, 64), weight=weight, epsilon=1e-6)])
    comm.fused_all_reduce_add_rms_norm(x, residual, weight, 1e-6, nccl)  # declared: fused
    assert len(seen) == 1 and runtime.calls[-1][0] == "fused"


def test_add_rms_norm_in_place_matches_torch():
    g = torch.Generator().manual_seed(1)
    x = torch.randn((4, 32), generator=g)
    residual = torch.randn((4, 32), generator=g)
    weight = torch.rand(32, generator=g)
    want_residual = x + residual
    want = torch.nn.functional.rms_norm(want_residual, (32,), weight, 1e-5)
    add_rms_norm_(x, residual, weight, 1e-5)
    torch.testing.assert_close(residual, want_residual)
    torch.testing.assert_close(x, want)


def test_runtime_build_failure_disables_with_a_log(pcie, monkeypatch, caplog):
    def build(group, device, limits):
        raise RuntimeError("peer access unavailable")

    monkeypatch.setattr(allreduce_mod, "AllReduce", build)

    class Group:
        def size(self):
            return 2

    with caplog.at_level(logging.WARNING, logger=allreduce_mod.logger.name):
        comm = PcieAllReduce(Group(), CPU, limits=Limits())
    assert comm.disabled
    assert "peer access unavailable" in caplog.text
    assert not comm.should_custom_ar(torch.ones((2, 4), dtype=torch.bfloat16))


def test_a_runtime_that_disabled_itself_disables_the_adapter(pcie, caplog):
    runtime = FakeRuntime.make()
    runtime.enabled, runtime.disabled_reason = False, "setup step 'open peers' failed on rank 1"
    with caplog.at_level(logging.WARNING, logger=allreduce_mod.logger.name):
        comm = PcieAllReduce(device=CPU, runtime=runtime)
    assert comm.disabled and "failed on rank 1" in caplog.text
    assert not comm.try_fused_add_rms_norm(torch.ones(2, 4), torch.zeros(2, 4), torch.ones(4), 1e-6)


# --- routing and limits through the runtime's own rules -----------------------------------


def test_without_a_runtime_declarations_route_with_the_runtime_rules(pcie):
    limits = Limits(oneshot_max=16, fused_max=64, twoshot_max=0)
    comm = PcieAllReduce(device=CPU, world_size=2, limits=limits)
    weight = torch.ones(4, dtype=torch.float32)
    comm.declare(
        [
            inv(pcie, "plain", (2, 4), dtype=torch.float32),  # 32 B: above the plain ceiling
            inv(pcie, "fused", (2, 4), dtype=torch.float32, weight=weight, epsilon=1e-6),
            inv(pcie, "small", (1, 4), dtype=torch.float32),  # 16 B: one-shot
        ]
    )
    assert comm.plans.routes() == {"fused": "oneshot_fused", "small": "oneshot"}
    x = torch.ones((2, 4), dtype=torch.float32)
    assert comm.plans.has_plan_for(x, FUSED, weight, 1e-6) and not comm.plans.has_plan_for(x)
    assert comm.disabled and not comm.should_custom_ar(torch.ones((1, 4)))  # nothing runs


@pytest.mark.parametrize(("rows", "route"), [(12, None), (16, "twoshot")])
def test_twoshot_rows_must_split_over_the_world(pcie, rows, route):
    limits = Limits(oneshot_max=16 << 10, fused_max=0, twoshot_max=768 << 10)
    comm = PcieAllReduce(device=CPU, world_size=4, limits=limits)
    comm.declare([inv(pcie, "m", (rows, 5120))])
    assert comm.plans.routes().get("m") == route


def test_limits_come_from_the_environment_and_reach_the_runtime(pcie, monkeypatch):
    built = []

    def build(group, device, limits):
        built.append(limits)
        return FakeRuntime.make(world_size=group.size(), limits=limits)

    monkeypatch.setattr(allreduce_mod, "AllReduce", build)

    class Group:
        def size(self):
            return 4

    env = {
        "B12X_ALLREDUCE_ONESHOT_MAX_SIZE": "16KB",
        "B12X_ALLREDUCE_TWOSHOT_MAX_SIZE": "off",
    }
    comm = PcieAllReduce(Group(), CPU, env=env)
    assert not comm.disabled and comm.world_size == 4
    assert built == [Limits.from_env(env)]
    assert built[0].oneshot_max == 16 << 10 and built[0].twoshot_max == 0
    with pytest.raises(ValueError, match="suffix"):
        PcieAllReduce(device=CPU, env={"B12X_ALLREDUCE_ONESHOT_MAX_SIZE": "84 KX"})


# --- describers ---------------------------------------------------------------------------


class Layer:
    def __init__(self, pcie, name):
        self.pcie, self.name = pcie, name

    def describe(self, workload):
        return [inv(self.pcie, f"{self.name}.m{r}", (r, 64)) for r in workload.token_counts]


class Workload:
    def __init__(self, token_counts, stage="weights"):
        self.token_counts, self.stage = token_counts, stage


def test_describers_declare_in_registration_order_and_refresh(pcie):
    comm, runtime = comm_with()
    first, second = Layer(pcie, "a"), Layer(pcie, "b")
    comm.register_describer(first, first.describe)
    comm.register_describer(second, second.describe)
    comm.register_describer(first, first.describe)  # idempotent: still one describer

    routes = comm.prepare(Workload((1, 4)))

    assert list(routes) == ["a.m1", "a.m4", "b.m1", "b.m4"]
    assert len(comm._describers) == 2
    assert comm.prepare(Workload((1,), stage="state")) == {}  # only the weights stage declares
    assert len(runtime.declared) == 1


def test_describer_owners_are_held_weakly(pcie):
    comm, _ = comm_with()
    layer, keep = Layer(pcie, "gone"), Layer(pcie, "kept")
    comm.register_describer(layer, layer.describe)
    comm.register_describer(keep, keep.describe)
    del layer
    gc.collect()
    assert list(comm.prepare(Workload((1,)))) == ["kept.m1"]
    assert len(comm._describers) == 1


def test_duplicate_names_are_an_error(pcie):
    comm, runtime = comm_with()
    one, two, three = Layer(pcie, "x"), Layer(pcie, "x"), Layer(pcie, "y")
    for layer in (three, one, two):
        comm.register_describer(layer, layer.describe)
    with pytest.raises(b12x.ConfigError, match=r"duplicates x\.m1, x\.m4$"):
        comm.prepare(Workload((1, 4)))
    assert runtime.declared == []


def test_register_collective_describer_only_on_pcie_all_reduce(pcie):
    from b12x.integration.vllm import register_collective_describer

    comm, _ = comm_with()
    layer = Layer(pcie, "l")
    assert register_collective_describer(comm, layer, layer.describe)
    assert not register_collective_describer(object(), layer, layer.describe)
    assert list(comm.prepare(Workload((1,)))) == ["l.m1"]


def test_close_forgets_everything_and_is_idempotent(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 4))])
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    assert comm.should_custom_ar(x)
    comm.close()
    comm.close()
    assert runtime.closed == 1
    assert comm.disabled and not comm.should_custom_ar(x) and not comm.plans.has_plan_for(x)
    assert comm.plans.declared_plans == [] and len(comm.plans) == 0


# --- one path: the runtime's declared plans and its one admission ---------------------------


def declared_sets(obj):
    """The declared-plan sets and indexes ``obj`` holds."""
    kinds = (pcie_module.DeclaredPlanIndex, pcie_module.DeclaredPlans)
    return [v for v in vars(obj).values() if isinstance(v, kinds)]


def test_the_adapter_keeps_no_index_of_its_own(pcie):
    comm, runtime = comm_with()
    comm.declare([inv(pcie, "m", (2, 4)), inv(pcie, "m.again", (2, 4))])
    assert comm.plans is runtime.plans and len(runtime.plans) == 1
    assert declared_sets(comm) == [runtime.plans]  # the runtime's own, held
    # without a runtime: one routing-only set, b12x's own, under the same limits
    offline = PcieAllReduce(device=CPU, world_size=2, limits=runtime.limits)
    (held,) = declared_sets(offline)
    assert type(held) is pcie.DeclaredPlans
    offline.declare([inv(pcie, "m", (2, 4))])
    assert offline.plans.routes() == {"m": "oneshot"} and offline.plans is held


def test_admission_is_one_runtime_call_and_the_run_gets_its_plan(pcie):
    comm, runtime = comm_with()
    weight = torch.ones(4, dtype=torch.float32)
    comm.declare(
        [
            inv(pcie, "m", (2, 4)),
            inv(pcie, "f", (2, 4), dtype=torch.float32, weight=weight, epsilon=1e-6),
        ]
    )
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    assert comm.should_custom_ar(x) and runtime.admissions == 1
    call = comm.admit(x)
    assert call.plan is plans_by_name(comm)["m"] and runtime.admissions == 2
    # custom_all_reduce runs what should_custom_ar admitted for the same tensor
    assert comm.custom_all_reduce(x) is not None and runtime.admissions == 2
    assert comm.custom_all_reduce(x) is not None and runtime.admissions == 3
    y, residual = torch.ones((2, 4)), torch.zeros((2, 4))
    assert comm.try_fused_add_rms_norm(y, residual, weight, 1e-6) and runtime.admissions == 4
    assert not comm.try_fused_add_rms_norm(y, y, weight, 1e-6) and runtime.admissions == 5
    assert runtime.runtime_launches() == 3 and [c[0] for c in runtime.calls] == [
        "all_reduce",
        "all_reduce",
        "fused",
    ]


def test_the_admission_alone_decides(pcie):
    # no Python check stands between the runtime's admission and the run
    comm, runtime = comm_with()
    runs = []

    class Call:
        def run(self):
            runs.append(self)
            return torch.zeros(1)

    comm.admit = lambda *args: Call()  # an admission that takes anything
    x = torch.ones((2, 4))
    assert comm.try_fused_add_rms_norm(x, x, torch.ones(4).half(), 1e-6, out=x.t())
    y = torch.ones(3)
    assert comm.should_custom_ar(y) and comm.custom_all_reduce(y) is not None
    comm.admit = lambda *args: None  # and one that takes nothing
    assert not comm.try_fused_add_rms_norm(x, torch.zeros_like(x), torch.ones(4), 1e-6)
    assert comm.custom_all_reduce(torch.ones((2, 4))) is None
    assert len(runs) == 2 and runtime.calls == []


def _decline_cases(pcie):
    """(reason, call) pairs: each call is declined for that one reason."""
    weight = torch.ones(8, dtype=torch.bfloat16)
    storage = torch.ones(64, dtype=torch.bfloat16)
    x, residual = (
        torch.ones((2, 8), dtype=torch.bfloat16),
        torch.zeros((2, 8), dtype=torch.bfloat16),
    )
    out = torch.empty_like(x)
    column_major = torch.zeros((8, 2), dtype=torch.bfloat16).t()
    declared = [inv(pcie, "m", (2, 8)), inv(pcie, "f", (2, 8), weight=weight, epsilon=1e-6)]
    plain = [
        ("undeclared shape", torch.ones((3, 8), dtype=torch.bfloat16)),
        ("undeclared dtype", x.float()),
        ("undeclared strides", torch.ones((2, 16), dtype=torch.bfloat16)[:, :8]),
        ("misaligned address", storage[1:17].view(2, 8)),
        ("not a tensor", [[1.0] * 8] * 2),
    ]
    fused = [
        ("another weight object", (x, residual, weight.clone(), 1e-6, None)),
        ("another epsilon", (x, residual, weight, 1e-5, None)),
        ("residual aliases the input", (x, x, weight, 1e-6, None)),
        ("residual not row-major", (x, column_major, weight, 1e-6, None)),
        ("residual of another dtype", (x, residual.float(), weight, 1e-6, None)),
        ("residual misaligned", (x, storage[1:17].view(2, 8), weight, 1e-6, None)),
        ("out of another dtype", (x, residual, weight, 1e-6, out.float())),
        ("out not row-major", (x, residual, weight, 1e-6, column_major.clone())),
        ("out aliases residual_out", (x, residual, weight, 1e-6, residual)),
    ]
    return declared, plain, fused


def test_declines_for_every_reason_take_one_admission_and_run_nothing(pcie):
    comm, runtime = comm_with()
    declared, plain, fused = _decline_cases(pcie)
    comm.declare(declared)
    for reason, t in plain:
        before = runtime.admissions
        assert not comm.should_custom_ar(t), reason
        assert runtime.admissions - before == 1, reason
        assert comm.custom_all_reduce(t) is None, reason  # vLLM never asks after a False
    for reason, (x, residual, weight, eps, out) in fused:
        before = runtime.admissions
        assert not comm.try_fused_add_rms_norm(x, residual, weight, eps, out), reason
        assert runtime.admissions - before == 1, reason
    assert runtime.calls == []
    # the same calls on their declared operands run
    assert comm.should_custom_ar(torch.ones((2, 8), dtype=torch.bfloat16))
    x = torch.ones((2, 8), dtype=torch.bfloat16)
    assert comm.try_fused_add_rms_norm(x, torch.zeros_like(x), declared[1].norm_weight, 1e-6)


@pytest.mark.parametrize("how", ["disabled", "closed", "no runtime"])
def test_a_dead_or_absent_runtime_declines_everything(pcie, how):
    declared = _decline_cases(pcie)[0]
    runtime = FakeRuntime.make()
    if how == "disabled":
        runtime.enabled, runtime.disabled_reason = False, "setup step 'allocate' failed"
    comm = PcieAllReduce(
        device=CPU,
        runtime=None if how == "no runtime" else runtime,
        limits=runtime.limits,
        world_size=2,
    )
    comm.declare(declared)
    if how == "closed":
        comm.close()
    x = torch.ones((2, 8), dtype=torch.bfloat16)
    assert not comm.should_custom_ar(x) and comm.custom_all_reduce(x) is None
    assert not comm.try_fused_add_rms_norm(x, torch.zeros_like(x), declared[1].norm_weight, 1e-6)
    assert runtime.calls == []
    assert len(runtime.declared) == (how == "closed")  # a dead runtime is not declared to
    # routing still answers where the adapter never had a live runtime
    assert comm.plans.has_plan_for(x) is (how != "closed")


# --- declarations derived from a vLLM config ----------------------------------------------


def serving_config(hidden=256, dtype=torch.bfloat16, max_tokens=64, sizes=(1, 2, 4, 128)):
    """The attributes of vllm.config.VllmConfig that the derivation reads."""
    from types import SimpleNamespace

    return SimpleNamespace(
        model_config=SimpleNamespace(get_hidden_size=lambda: hidden, dtype=dtype),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=max_tokens),
        compilation_config=SimpleNamespace(cudagraph_capture_sizes=list(sizes)),
    )


def test_serving_shapes_cover_eager_counts_and_capture_sizes():
    from b12x.integration.vllm.declarations import ServingShapes

    shapes = ServingShapes.from_vllm_config(serving_config(sizes=(8, 4, 128, 0)))
    assert shapes.hidden_size == 256 and shapes.dtype == torch.bfloat16
    assert shapes.cudagraph_capture_sizes == (4, 8, 128)
    assert shapes.token_counts(512, 1 << 20) == [*range(1, 65), 128]
    assert shapes.token_counts(512, 512 * 10) == list(range(1, 11))  # bounded by bytes
    assert shapes.token_counts(512, 100) == []
    from types import SimpleNamespace

    assert ServingShapes.from_vllm_config(SimpleNamespace(model_config=None)) is None


def test_auto_declarations_route_through_the_runtime_rules(pcie):
    from b12x.integration.vllm.declarations import AutoDeclarations, ServingShapes

    limits = Limits(oneshot_max=8 << 10, fused_max=2 << 10, twoshot_max=0)
    auto = AutoDeclarations(ServingShapes.from_vllm_config(serving_config()), limits)
    comm = PcieAllReduce(device=CPU, world_size=2, limits=limits)
    comm.register_describer(auto, auto.describe)
    routes = comm.prepare()
    assert len(routes) == 16  # 512-byte rows under an 8 KiB one-shot ceiling
    has_plan_for = comm.plans.has_plan_for
    assert has_plan_for(torch.empty((16, 256), dtype=torch.bfloat16))
    assert not has_plan_for(torch.empty((17, 256), dtype=torch.bfloat16))
    assert not has_plan_for(torch.empty((4, 256), dtype=torch.float32))

    weight = torch.ones(256, dtype=torch.bfloat16)
    assert not auto.pending
    declared, rows = auto.norm(weight.data, 1e-6)  # vLLM passes weight.data: a new alias
    assert declared is not weight and auto.pending and rows == 4  # 2 KiB: 4 rows of 512 B
    again, _ = auto.norm(weight.data, 1e-6)
    assert again is declared and auto.norm_count == 1
    assert auto.norm(weight, 1e-5) is not None  # another epsilon, another declaration
    assert auto.norm_count == 2
    routes = comm.prepare()
    fused = [n for n, r in routes.items() if r == "oneshot_fused"]
    assert len(fused) == 2 * 4  # 2 KiB fused ceiling: 4 rows per norm
    x = torch.empty((4, 256), dtype=torch.bfloat16)
    assert has_plan_for(x, FUSED, declared, 1e-6)
    assert not has_plan_for(x, FUSED, weight, 1e-6)  # the index keys the declared object


def test_auto_declarations_refuse_what_they_cannot_declare(monkeypatch):
    from b12x.integration.vllm import declarations
    from b12x.integration.vllm.declarations import AutoDeclarations, ServingShapes

    auto = AutoDeclarations(ServingShapes.from_vllm_config(serving_config()), Limits())
    assert auto.norm(torch.ones(256), 1e-6) is None  # not the model dtype
    assert auto.norm(torch.ones(2, 128, dtype=torch.bfloat16), 1e-6) is None
    assert auto.norm(torch.ones(256, dtype=torch.bfloat16), -1.0) is None
    monkeypatch.setattr(declarations, "MAX_NORMS", 2)
    kept = [torch.ones(256, dtype=torch.bfloat16) for _ in range(3)]
    assert [auto.norm(w, 1e-6) is not None for w in kept] == [True, True, False]  # bounded
    assert auto.norm_count == 2


def test_fused_probe_and_separate_output(pcie):
    comm, runtime = comm_with()
    assert comm.supports_fused_add_rms_norm()
    weight = torch.ones(4, dtype=torch.float32)
    comm.declare([inv(pcie, "f", (2, 4), dtype=torch.float32, weight=weight, epsilon=1e-6)])
    x, residual = torch.ones((2, 4)), torch.zeros((2, 4))
    out = torch.empty_like(x)
    assert comm.try_fused_add_rms_norm(x, residual, weight, 1e-6, out)
    ((kind, operands),) = runtime.calls
    assert kind == "fused" and operands[3] is out and operands[4] is residual
    assert not comm.try_fused_add_rms_norm(x, residual, weight, 1e-6, out.half())
    assert not comm.try_fused_add_rms_norm(x, residual, weight, 1e-6, torch.empty((4, 2)).t())
    off = PcieAllReduce(device=CPU, runtime=FakeRuntime.make(limits=Limits(fused_max=0)))
    assert not off.supports_fused_add_rms_norm()
    assert not PcieAllReduce(device=CPU, limits=Limits()).supports_fused_add_rms_norm()


# --- the vLLM slot ------------------------------------------------------------------------


class StockAllreduce:
    """vLLM's own CustomAllreduce as the slot uses it: takes what ``takes`` says."""

    takes = staticmethod(lambda t: False)

    def __init__(self, group, device, *args, **kwargs):
        self.disabled, self.calls = False, []

    def should_custom_ar(self, inp):
        self.calls.append("should")
        return self.takes(inp)

    def custom_all_reduce(self, inp):
        self.calls.append("custom")
        return inp * 10

    def close(self):
        pass


class Group:
    def size(self):
        return 2


def slot_with(monkeypatch, runtime):
    """b12x's slot as vLLM's CudaCommunicator builds it, over ``runtime``."""
    from b12x.integration.vllm import _hooks, communicator

    monkeypatch.setattr(communicator, "_stock_class", lambda: StockAllreduce)
    monkeypatch.setattr(
        communicator.B12xCustomAllreduce, "runtime_factory", lambda group, device, limits: runtime
    )
    monkeypatch.setattr(_hooks, "same_node", lambda group: True)
    monkeypatch.setattr(_hooks, "vllm_config", serving_config)
    monkeypatch.setattr(_hooks, "flashinfer_all_reduce_first", lambda: False)
    return communicator.B12xCustomAllreduce(Group(), CPU)


def vllm_all_reduce(slot, x):
    """What CudaCommunicator.all_reduce does with its custom all-reduce slot."""
    if slot.should_custom_ar(x):
        out = slot.custom_all_reduce(x)
        assert out is not None
        return out
    return None


def test_the_vllm_slot_admits_each_all_reduce_once(monkeypatch):
    runtime = FakeRuntime.make()
    slot = slot_with(monkeypatch, runtime)
    stock = slot.fallback
    stock.takes = lambda t: t.shape == (3, 384)
    ours = torch.ones((4, 256), dtype=torch.bfloat16)  # declared from the config
    theirs = torch.ones((3, 384), dtype=torch.bfloat16)  # vLLM's own takes it
    nobody = torch.ones((2, 4, 256), dtype=torch.bfloat16)  # NCCL's
    seen = {}
    for label, x in {"ours": ours, "theirs": theirs, "nobody": nobody}.items():
        admissions, calls, stock_calls = runtime.admissions, len(runtime.calls), len(stock.calls)
        out = vllm_all_reduce(slot, x)
        seen[label] = (
            runtime.admissions - admissions,
            len(runtime.calls) - calls,
            stock.calls[stock_calls:],
            None if out is None else float(out[0, 0]),
        )
        assert slot._pending is None  # no tensor kept past the call
    assert seen == {
        "ours": (1, 1, [], 2.0),
        "theirs": (1, 0, ["should", "custom"], 10.0),
        "nobody": (1, 0, ["should"], None),
    }
    # a custom_all_reduce of another tensor, or of none admitted first, admits it itself
    assert slot.should_custom_ar(ours)
    admissions = runtime.admissions
    assert float(slot.custom_all_reduce(ours.clone())[0, 0]) == 2.0
    assert float(slot.custom_all_reduce(ours)[0, 0]) == 2.0
    assert runtime.admissions - admissions == 2
    slot.close()


def test_the_fused_op_traces_with_its_fake_implementation():
    from b12x.integration.vllm import fused_op  # noqa: F401 (registers torch.ops.b12x)
    from torch.fx.experimental.proxy_tensor import make_fx

    def step(x, residual, weight):
        return torch.ops.b12x.fused_all_reduce_add_rms_norm(x, residual, weight, 1e-6)

    args = (torch.ones(3, 64), torch.ones(3, 64), torch.ones(64))
    graph = make_fx(step, tracing_mode="fake")(*args)
    targets = [node.target for node in graph.graph.nodes if node.op == "call_function"]
    assert torch.ops.b12x.fused_all_reduce_add_rms_norm.default in targets
    # the op's schema says what vLLM's functionalization needs: residual is mutated
    schema = torch.ops.b12x.fused_all_reduce_add_rms_norm.default._schema
    assert [a.name for a in schema.arguments if a.alias_info and a.alias_info.is_write] == [
        "residual"
    ]


# --- shaped like vLLM's CustomAllreduce (issue 21, items 7 and 8) ---------------------------


def test_dropping_the_adapter_closes_its_runtime():
    runtime = FakeRuntime.make()
    comm = PcieAllReduce(device=CPU, runtime=runtime)
    assert runtime.enabled
    del comm
    gc.collect()
    assert runtime.closed == 1 and not runtime.enabled


def test_all_gather_and_reduce_scatter_decline_without_a_fallback():
    comm, runtime = comm_with()
    x = torch.ones((4, 8), dtype=torch.bfloat16)
    assert comm.custom_all_gather(x) is None and comm.custom_reduce_scatter(x) is None
    assert runtime.calls == []


def test_the_adapter_takes_every_constructor_form_vllm_and_the_fork_use():
    runtime = FakeRuntime.make()
    # vLLM: (group=, device=, symm_mem_enabled=, register_graph_buffers=); the fork adds
    # device_group=; max_size is vLLM's own option
    comm = PcieAllReduce(
        device=CPU,
        runtime=runtime,
        device_group=object(),
        symm_mem_enabled=False,
        register_graph_buffers=True,
        max_size=8 << 20,
    )
    assert not comm.disabled
    comm.close()


def test_a_slot_whose_vllm_half_failed_to_build_logs_no_second_error(monkeypatch, caplog):
    from b12x.integration.vllm import communicator

    class Refusing:
        def __init__(self, group, device, **options):
            raise RuntimeError("vLLM's own custom all-reduce failed to build")

    monkeypatch.setattr(communicator, "_stock_class", lambda: Refusing)
    unraisable = []  # a __del__ that raises reaches this hook, not logging
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with caplog.at_level(logging.WARNING), pytest.raises(RuntimeError, match="failed to build"):
        communicator.B12xCustomAllreduce(group=Group(), device=CPU, device_group=object())
    gc.collect()
    assert "teardown" not in caplog.text and "Exception ignored" not in caplog.text
    assert unraisable == []
