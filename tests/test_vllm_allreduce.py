"""The PCIe all-reduce adapter: the seed's qualifying tests (spec §10 items 1-7).

Items 1-6 go through the adapter's declared-plan index (``b12x.comm.pcie``'s
``DeclaredPlanIndex`` when it imports, the spec's dict index otherwise);
item 7 drives routing and dispatch against a recording runtime double.
"""

from __future__ import annotations

import gc
import logging

import b12x
import pytest
import torch
import vllm_fakes as fakes
from b12x.integration.vllm import Limits, PcieAllReduce, add_rms_norm_, parse_byte_size
from b12x.integration.vllm import allreduce as allreduce_mod
from b12x.integration.vllm.allreduce import FUSED, PLAIN
from b12x.integration.vllm.limits import _parse_byte_size_fallback
from vllm_fakes import FakeRuntime

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def pcie(monkeypatch):
    module = fakes.pcie_or_standin()
    monkeypatch.setattr(allreduce_mod, "_pcie", lambda: module)
    return module


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


def indexed(*invocations):
    """An adapter whose index holds ``invocations``, each with its own plan object."""
    comm = PcieAllReduce(device=CPU)
    comm._invocations = {i.name: i for i in invocations}
    comm._plans = {i.name: f"plan:{i.name}" for i in invocations}
    comm._index_declared_plans()
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
    assert comm._plan_for(x, FUSED, weight_a, 1e-6) == "plan:a"
    assert comm._plan_for(x, FUSED, weight_b, 1e-6) == "plan:b"
    assert comm._plan_for(x, FUSED, weight_a, 1e-5) == "plan:epsilon"
    assert not comm._has_plan_for(x)
    assert not comm._has_plan_for(x, FUSED, weight_a.clone(), 1e-6)
    assert not comm._has_plan_for(x, FUSED, weight_a, 1e-4)


def test_item2_shape_dtype_strides_and_first_match(pcie):
    comm = indexed(
        inv(pcie, "first", (2, 4)),
        inv(pcie, "equivalent", (2, 4), strides=(4, 1)),
        inv(pcie, "strided", (2, 4), strides=(8, 1)),
    )
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    assert comm._plan_for(x) == "plan:first"  # first equal key wins
    assert comm._plan_for(torch.empty((2, 8), dtype=torch.bfloat16)[:, :4]) == "plan:strided"
    assert not comm._has_plan_for(x.float())
    assert not comm._has_plan_for(x.reshape(8))


def test_item3_the_index_is_a_snapshot_until_rebuilt(pcie):
    comm = indexed(inv(pcie, "first", (2, 4)))
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    comm._invocations = {}
    assert comm._plan_for(x) == "plan:first"
    comm._index_declared_plans()
    assert not comm._has_plan_for(x)


def test_item4_undeclared_shapes_are_rejected_and_never_cached(pcie):
    comm = indexed()
    for rows in range(1, 65):
        x = torch.empty((rows, 4), dtype=torch.bfloat16)
        assert not comm._has_plan_for(x)
        with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan"):
            comm._plan_for(x)
    assert len(comm._index) == 0


@pytest.mark.parametrize("declared", [None, (8, 1)])
def test_item5_size_one_dims_ignore_their_stride(pcie, declared):
    one = inv(pcie, "one", (1, 8), strides=declared)
    two = inv(pcie, "two", (2, 8), strides=declared)
    comm = indexed(one, two)
    storage = torch.empty(64, dtype=torch.bfloat16)

    def live(shape, strides):
        return storage.as_strided(shape, strides)

    assert comm._plan_for(live((1, 8), (10, 1))) == "plan:one"
    assert comm._plan_for(live((2, 8), (8, 1))) == "plan:two"
    assert not comm._has_plan_for(live((2, 8), (10, 1)))
    assert not comm._has_plan_for(live((1, 8), (8, 2)))


def test_item6_plan_for_on_an_empty_communicator_raises(pcie):
    comm = PcieAllReduce(device=CPU)
    x = torch.empty((2, 4), dtype=torch.bfloat16)
    with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan for"):
        comm._plan_for(x)
    assert not comm.has_plan_for(x)
    assert isinstance(b12x.UndeclaredPlanError("x"), RuntimeError)


# --- item 7: routing and dispatch with a recording runtime ---------------------------------


def comm_with(limits, world_size=2, refuse=()):
    runtime = FakeRuntime(world_size=world_size, refuse=refuse)
    return PcieAllReduce(device=CPU, runtime=runtime, limits=limits), runtime


def test_eager_oneshot_dispatch_passes_the_plan_and_no_stream(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=1024))
    comm.declare([inv(pcie, "o_proj.m2", (2, 4))])
    x = torch.arange(8, dtype=torch.bfloat16).reshape(2, 4)

    assert comm.should_custom_ar(x)
    out = comm.custom_all_reduce(x)

    name, call = runtime.calls[-1]
    assert name == "all_reduce"
    assert call["plan"] is comm._plans["o_proj.m2"]
    assert call["stream"] is None
    assert call["out"] is None
    assert torch.equal(out, x * 2)
    assert comm._routes == {"o_proj.m2": "oneshot"}


def test_fused_has_its_own_ceiling(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=16, fused_max=64))
    weight = torch.ones(4, dtype=torch.float32)
    comm.declare(
        [
            inv(pcie, "plain", (2, 4), dtype=torch.float32),
            inv(pcie, "fused", (2, 4), dtype=torch.float32, weight=weight, epsilon=1e-6),
        ]
    )
    x = torch.ones((2, 4), dtype=torch.float32)  # 32 bytes: above plain, within fused
    residual = torch.zeros_like(x)

    assert comm._routes == {"fused": "oneshot_fused"}
    assert not comm.should_custom_ar(x)
    assert comm.custom_all_reduce(x) is None
    assert comm.try_fused_add_rms_norm(x, residual, weight, 1e-6)
    name, call = runtime.calls[-1]
    assert name == "fused"
    assert call["out"] is x and call["residual_out"] is residual
    assert call["plan"] is comm._plans["fused"]
    assert call["stream"] is None
    assert not comm.try_fused_add_rms_norm(x, residual, weight, 1e-5)  # undeclared epsilon
    assert not comm.try_fused_add_rms_norm(x, residual, weight.clone(), 1e-6)  # another weight
    assert not comm.try_fused_add_rms_norm(x, x, weight, 1e-6)  # residual aliases the input


def test_twoshot_window_and_oneshot_priority(pcie):
    limits = Limits(oneshot_max=32, fused_max=0, twoshot_max=256, twoshot_row_elems=8)
    comm, runtime = comm_with(limits)
    comm.declare(
        [
            inv(pcie, "small", (2, 8)),  # 32 B: one-shot has priority
            inv(pcie, "window", (4, 8)),  # 64 B, numel 32 % (2 * 8) == 0
            inv(pcie, "ragged", (3, 8)),  # 48 B, numel 24 % 16 != 0
            inv(pcie, "padded", (4, 8), strides=(16, 1)),  # not row-major
            inv(pcie, "fp16", (4, 8), dtype=torch.float16),  # two-shot is bf16 only
            inv(pcie, "big", (32, 8)),  # 512 B: above the window, no DMA route
        ]
    )
    assert comm._routes == {"small": "oneshot", "window": "twoshot"}

    x = torch.ones((4, 8), dtype=torch.bfloat16)
    out = comm.custom_all_reduce(x)
    _, call = runtime.calls[-1]
    assert call["out"] is out and out is not x and out.shape == x.shape  # fresh output
    assert call["plan"] is comm._plans["window"]
    assert torch.equal(out, x * 2)
    for shape in ((3, 8), (32, 8)):
        assert comm.custom_all_reduce(torch.ones(shape, dtype=torch.bfloat16)) is None


@pytest.mark.parametrize(("rows", "route"), [(12, None), (16, "twoshot")])
def test_twoshot_rows_must_split_over_the_world(pcie, rows, route):
    limits = Limits(oneshot_max=16 << 10, fused_max=0, twoshot_max=768 << 10)
    invocation = inv(pcie, "m", (rows, 5120))
    assert allreduce_mod.route_invocation(invocation, 4, limits) == route


def test_runtime_refusal_declines(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=0), refuse=("refused",))
    comm.declare([inv(pcie, "refused", (2, 4)), inv(pcie, "kept", (4, 4))])
    assert [i.name for i in runtime.declared[0]] == ["refused", "kept"]
    assert comm.custom_all_reduce(torch.ones((2, 4), dtype=torch.bfloat16)) is None
    assert not comm.should_custom_ar(torch.ones((2, 4), dtype=torch.bfloat16))
    assert comm.should_custom_ar(torch.ones((4, 4), dtype=torch.bfloat16))


def test_live_address_and_device_are_admitted_separately(pcie):
    comm, _ = comm_with(Limits(oneshot_max=1024, fused_max=0))
    comm.declare([inv(pcie, "m", (2, 8))])
    storage = torch.ones(40, dtype=torch.bfloat16)
    aligned = storage[:16].view(2, 8)
    misaligned = storage[1:17].view(2, 8)  # same key, address 2 bytes off
    assert comm.should_custom_ar(aligned)
    assert comm.has_plan_for(misaligned)
    assert not comm.should_custom_ar(misaligned)
    assert comm.custom_all_reduce(misaligned) is None
    comm.device = torch.device("cuda", 0)
    assert not comm.should_custom_ar(aligned)


def test_equal_declarations_share_one_plan(pcie):
    comm, _ = comm_with(Limits(oneshot_max=84 << 10, fused_max=84 << 10))
    weight = torch.ones(6144, dtype=torch.bfloat16)
    declared = []
    for layer in range(40):
        declared.append(inv(pcie, f"layers.{layer}.m1", (1, 6144)))
        declared.append(inv(pcie, f"layers.{layer}.fused", (4, 6144), weight=weight, epsilon=1e-6))
    comm.declare(declared)
    plain = {id(comm._plans[f"layers.{i}.m1"]) for i in range(40)}
    fused = {id(comm._plans[f"layers.{i}.fused"]) for i in range(40)}
    assert len(plain) == len(fused) == 1 and plain != fused
    assert len(comm._index) == 2


def test_all_reduce_raises_on_undeclared(pcie):
    comm, _ = comm_with(Limits(oneshot_max=1024, fused_max=0))
    comm.declare([inv(pcie, "m", (2, 4))])
    with pytest.raises(b12x.UndeclaredPlanError, match="no declared plan for"):
        comm.all_reduce(torch.ones((3, 4), dtype=torch.bfloat16))
    assert torch.equal(
        comm.all_reduce(torch.ones((2, 4), dtype=torch.bfloat16)),
        torch.full((2, 4), 2.0, dtype=torch.bfloat16),
    )


class Stream:
    """A stand-in CUDA stream (identity is all the adapter compares)."""


def test_capture_forwards_the_stream_and_restores_state(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=0))
    comm.declare([inv(pcie, "m", (2, 4))])
    graph_stream, other = Stream(), Stream()
    current = [graph_stream]
    comm._current_stream = lambda: current[0]
    x = torch.ones((2, 4), dtype=torch.bfloat16)

    with comm.capture():
        assert runtime.in_capture
        comm.custom_all_reduce(x)
        assert runtime.calls[-1][1]["stream"] is graph_stream
        current[0] = other  # an op issued on another stream gets the runtime default
        comm.custom_all_reduce(x)
        assert runtime.calls[-1][1]["stream"] is None
    assert runtime.captures == [graph_stream]
    assert not comm._capturing and comm._capture_stream is None

    current[0] = graph_stream
    with pytest.raises(RuntimeError, match="body failed"), comm.capture(stream=graph_stream):
        raise RuntimeError("body failed")
    assert not comm._capturing and comm._capture_stream is None
    assert not runtime.in_capture
    comm.custom_all_reduce(x)
    assert runtime.calls[-1][1]["stream"] is None


def test_capture_without_declarations_is_refused(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=0))
    with pytest.raises(b12x.UndeclaredPlanError, match="declared plans expected"), comm.capture():
        pass
    assert runtime.captures == []
    disabled = PcieAllReduce(device=CPU)
    with disabled.capture():  # disabled: a no-op
        pass


def test_fused_fallback_matches_all_reduce_then_add_rms_norm(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=0, fused_max=0))
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

    comm.fused_all_reduce_add_rms_norm(x, residual, weight, 1e-6, nccl)

    assert len(seen) == 1 and runtime.calls == []
    assert torch.equal(residual, r)
    torch.testing.assert_close(x, expected, atol=2e-2, rtol=2e-2)


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


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("17", 17),
        ("84KB", 86016),
        ("6 MiB", 6291456),
        ("2g", 1 << 31),
        ("1t", 1 << 40),
        (" 3 b ", 3),
    ],
)
def test_byte_sizes(text, value):
    assert parse_byte_size(text) == value
    assert _parse_byte_size_fallback(text) == value


@pytest.mark.parametrize(
    ("text", "match"), [("84 KX", "suffix"), ("KB", "byte size"), ("", "byte size")]
)
def test_bad_byte_sizes(text, match):
    with pytest.raises(ValueError, match=match):
        parse_byte_size(text)


def test_limits_from_env():
    assert Limits.from_env(2, {}) == Limits(86016, 86016, 0, 4096)
    env = {
        "VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE": "16KB",
        "VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE": "72KB",
        "VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE": "768KB",
    }
    limits = Limits.from_env(4, env)
    assert (limits.oneshot_max, limits.fused_max) == (16 << 10, 72 << 10)
    assert limits.twoshot_max == 96 * 4096 * 2 == 786432  # 96 rows: a multiple of 4 ranks
    assert limits.buffer_bytes == 72 << 10
    assert Limits.from_env(2, {"VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE": "0"}).oneshot_max == 0
    for off in ("", "0", "off", "None", "disabled"):
        assert Limits.from_env(4, {"VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE": off}).twoshot_max == 0
    # Rows round down to a multiple of the world: 3 rows of 4096 over 4 ranks is none.
    few = {"VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE": str(3 * 4096 * 2)}
    assert Limits.from_env(4, few).twoshot_max == 0
    with pytest.raises(b12x.ConfigError, match="expected a size >= 0"):
        Limits.from_env(2, {"VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE": "-1"})
    with pytest.raises(b12x.ConfigError, match="ROW_ELEMS expected > 0"):
        Limits.from_env(2, {"VLLM_PCIE_TWOSHOT_ROW_ELEMS": "0"})


def test_explicit_limits_reach_the_runtime(pcie, monkeypatch):
    built = []

    def build(group, device, limits):
        built.append(limits)
        return FakeRuntime(world_size=group.size())

    monkeypatch.setattr(allreduce_mod, "_build_runtime", build)

    class Group:
        def size(self):
            return 4

    env = {"VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE": "16KB"}
    comm = PcieAllReduce(Group(), CPU, env=env)
    assert not comm.disabled and comm.world_size == 4
    assert built == [Limits(16 << 10, 86016, 0, 4096)]


def test_runtime_build_failure_disables_with_a_log(pcie, monkeypatch, caplog):
    def build(group, device, limits):
        raise RuntimeError("peer access unavailable")

    monkeypatch.setattr(allreduce_mod, "_build_runtime", build)

    class Group:
        def size(self):
            return 2

    with caplog.at_level(logging.WARNING, logger=allreduce_mod.logger.name):
        comm = PcieAllReduce(Group(), CPU)
    assert comm.disabled
    assert "peer access unavailable" in caplog.text
    assert not comm.should_custom_ar(torch.ones((2, 4), dtype=torch.bfloat16))


# --- describers ---------------------------------------------------------------------------


class Layer:
    def __init__(self, pcie, name, rows=(1, 4)):
        self.pcie, self.name, self.rows = pcie, name, rows

    def describe(self, workload):
        return [inv(self.pcie, f"{self.name}.m{r}", (r, 64)) for r in workload.token_counts]


class Workload:
    def __init__(self, token_counts, stage="weights"):
        self.token_counts, self.stage = token_counts, stage


def test_describers_declare_in_registration_order_and_refresh(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=84 << 10, fused_max=0))
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
    comm, _ = comm_with(Limits(oneshot_max=84 << 10, fused_max=0))
    layer, keep = Layer(pcie, "gone"), Layer(pcie, "kept")
    comm.register_describer(layer, layer.describe)
    comm.register_describer(keep, keep.describe)
    del layer
    gc.collect()
    assert list(comm.prepare(Workload((1,)))) == ["kept.m1"]
    assert len(comm._describers) == 1


def test_duplicate_names_are_an_error(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=84 << 10, fused_max=0))
    one, two, three = Layer(pcie, "x"), Layer(pcie, "x"), Layer(pcie, "y")
    for layer in (three, one, two):
        comm.register_describer(layer, layer.describe)
    with pytest.raises(b12x.ConfigError, match=r"duplicates x\.m1, x\.m4$"):
        comm.prepare(Workload((1, 4)))
    assert runtime.declared == []


def test_without_a_runtime_declarations_still_index_but_never_run(pcie):
    comm = PcieAllReduce(device=CPU, limits=Limits(oneshot_max=84 << 10, fused_max=0))
    layer = Layer(pcie, "l")
    comm.register_describer(layer, layer.describe)
    assert comm.prepare(Workload((1, 4))) == {"l.m1": "oneshot", "l.m4": "oneshot"}
    x = torch.ones((4, 64), dtype=torch.bfloat16)
    assert comm.has_plan_for(x)
    assert comm.disabled and not comm.should_custom_ar(x) and comm.custom_all_reduce(x) is None


def test_close_forgets_everything_and_is_idempotent(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=0))
    comm.declare([inv(pcie, "m", (2, 4))])
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    assert comm.should_custom_ar(x)
    comm.close()
    comm.close()
    assert runtime.closed == 1
    assert comm.disabled and not comm.should_custom_ar(x) and not comm.has_plan_for(x)
    assert comm._plans == {} and comm._invocations == {} and len(comm._index) == 0


def test_enabled_but_nothing_declared_declines(pcie):
    comm, runtime = comm_with(Limits(oneshot_max=1024, fused_max=1024))
    x = torch.ones((2, 4), dtype=torch.bfloat16)
    assert not comm.should_custom_ar(x)
    assert comm.custom_all_reduce(x) is None
    assert not comm.try_fused_add_rms_norm(x, x.clone(), torch.ones(4, dtype=torch.bfloat16), 0.0)
    assert runtime.calls == []


def test_register_collective_describer_only_on_pcie_all_reduce(pcie):
    from b12x.integration.vllm import register_collective_describer

    comm, _ = comm_with(Limits(oneshot_max=84 << 10, fused_max=0))
    layer = Layer(pcie, "l")
    assert register_collective_describer(comm, layer, layer.describe)
    assert not register_collective_describer(object(), layer, layer.describe)
    assert list(comm.prepare(Workload((1,)))) == ["l.m1"]
