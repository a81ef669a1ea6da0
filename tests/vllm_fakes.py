"""Small fakes for the vLLM adapters: no vLLM, no GPU.

* vLLM's side: a forward context, indexer metadata, a workspace manager that
  counts ``get_simultaneous`` calls, a cache holder.
* b12x's side: counting wrappers around the indexer module, and a runtime
  double for the all-reduce adapter that records every call.
* Stand-ins for ``b12x.attention.dsa_indexer`` and ``b12x.comm.pcie`` used only
  while those modules are not on this branch yet (``*_or_standin`` picks the
  real module when it imports).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from b12x.errors import UndeclaredPlanError

# --- vLLM side ----------------------------------------------------------------------------


class Workspace:
    """vLLM's workspace manager: one growing byte buffer, fresh views per request."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.calls = 0
        self.requests: list[tuple[Any, ...]] = []
        self.views: list[torch.Tensor] = []
        self._buffer = torch.empty(0, dtype=torch.uint8, device=self.device)

    @property
    def nbytes(self) -> int:
        return self._buffer.numel()

    def get_simultaneous(self, *shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]):
        self.calls += 1
        self.requests.append(shapes_and_dtypes)
        sizes = []
        for shape, dtype in shapes_and_dtypes:
            numel = 1
            for d in shape:
                numel *= d
            sizes.append(-(-numel * dtype.itemsize // 256) * 256)
        if sum(sizes) > self._buffer.numel():
            self._buffer = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
        views, offset = [], 0
        for (shape, dtype), size in zip(shapes_and_dtypes, sizes, strict=True):
            count = 1
            for d in shape:
                count *= d
            raw = self._buffer[offset : offset + size].view(dtype)
            views.append(raw[:count].view(shape))
            offset += size
        self.views.extend(views)
        return views


@dataclass
class ForwardContext:
    attn_metadata: Any = None
    cudagraph_runtime_mode: Any = "NONE"
    batch_descriptor: Any = None


@dataclass
class PrefillChunk:
    token_start: int
    token_end: int
    cu_seqlen_ks: torch.Tensor
    cu_seqlen_ke: torch.Tensor
    total_seq_lens: int
    block_table: torch.Tensor
    num_reqs: int = 1


@dataclass
class DecodeMetadata:
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    requires_padding: bool = False
    active_width: torch.Tensor | None = None


@dataclass
class IndexerMetadata:
    num_decode_tokens: int = 0
    decode: DecodeMetadata | None = None
    prefill: Any = None


def prefill_metadata(chunks: list[PrefillChunk]) -> Any:
    return SimpleNamespace(chunks=chunks)


@dataclass
class CacheHolder:
    """What vLLM passes as ``k_cache``: a metadata prefix and the cache tensor."""

    kv_cache: torch.Tensor
    prefix: str = "model.layers.0.attn.indexer"


def install_vllm(monkeypatch, workspace: Workspace, context: ForwardContext | None = None):
    """Points the adapters' vLLM hooks at the fakes."""
    from b12x.integration.vllm import _hooks

    monkeypatch.setattr(_hooks, "workspace_manager", lambda: workspace)
    if context is not None:
        monkeypatch.setattr(_hooks, "forward_context", lambda: context)


# --- the indexer module -------------------------------------------------------------------


def _real(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


class CountingIndexer:
    """Wraps an indexer module; counts plan/bind/run and keeps what they saw."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.Caps = module.Caps
        self.PAGED_INDEX_PAGE_SIZE = module.PAGED_INDEX_PAGE_SIZE
        self.is_supported = module.is_supported
        self.calls = {"plan": 0, "bind": 0, "run": 0}
        self.caps: list[Any] = []
        self.plans: list[Any] = []
        self.binds: list[tuple[Any, dict[str, Any]]] = []
        self.outputs_before_run: list[torch.Tensor] = []

    def plan(self, caps: Any) -> Any:
        self.calls["plan"] += 1
        self.caps.append(caps)
        plan = self.module.plan(caps)
        self.plans.append(plan)
        return plan

    def bind(self, plan: Any, **operands: Any) -> Any:
        self.calls["bind"] += 1
        self.binds.append((plan, operands))
        return self.module.bind(plan, **operands)

    def run(self, binding: Any) -> Any:
        self.calls["run"] += 1
        self.outputs_before_run.append(self.binds[-1][1]["output_indices"].clone())
        return self.module.run(binding)

    def distinct_plans(self) -> int:
        return len({id(p) for p in self.plans})


class StandinIndexer:
    """Stand-in for ``b12x.attention.dsa_indexer`` until branch `planning` lands.

    Interns plans by caps and, in ``run``, writes every output slot (the
    first ``min(len, topk)`` logical rows, then -1), so the adapter's
    plumbing can be checked; it computes no scores.
    """

    PAGED_INDEX_PAGE_SIZE = 64

    @dataclass(frozen=True)
    class Caps:
        device: Any
        num_q_heads: int
        max_q_rows: int
        max_page_table_width: int
        topk: int
        mode: str = "decode"

        def __post_init__(self):
            if self.topk not in (512, 1024, 2048):
                raise ValueError(f"Caps: topk expected 512, 1024 or 2048, got {self.topk}")
            if self.mode not in ("decode", "prefill"):
                raise ValueError(f"Caps: mode expected decode or prefill, got {self.mode!r}")

    def __init__(self) -> None:
        self._plans: dict[Any, Any] = {}

    @staticmethod
    def is_supported(device: Any = None) -> bool:
        return False

    def plan(self, caps: Caps) -> Any:
        if caps not in self._plans:
            route = "shared_prefill" if caps.mode == "prefill" else "paged_decode"
            nbytes = 1024 * max(1, caps.max_q_rows)
            self._plans[caps] = SimpleNamespace(
                caps=caps,
                route=route,
                nbytes=nbytes,
                shapes_and_dtypes=lambda n=nbytes: (((n,), torch.uint8),),
            )
        return self._plans[caps]

    def bind(self, plan: Any, **operands: Any) -> Any:
        return SimpleNamespace(plan=plan, **operands)

    def run(self, binding: Any) -> Any:
        out = binding.output_indices
        visible = torch.clamp(binding.cache_lengths, max=out.shape[1]).to(torch.int64)
        slots = torch.arange(out.shape[1], dtype=torch.int64).expand_as(out)
        out.copy_(torch.where(slots < visible[:, None], slots, -1))
        if binding.output_scores is not None:
            binding.output_scores.fill_(0.0)
        return out


def indexer_module_or_standin() -> Any:
    return _real("b12x.attention.dsa_indexer") or StandinIndexer()


# --- the all-reduce side ------------------------------------------------------------------


@dataclass(frozen=True)
class StandinInvocation:
    """Stand-in for ``b12x.comm.pcie.Invocation`` (no validation)."""

    name: str
    operation: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...] | None = None
    input_alignment: int = 16
    norm_weight: Any = None
    epsilon: float | None = None
    channel_id: str | None = None
    persistent_input: Any = None


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def _key(operation, shape, dtype, strides, weight, epsilon):
    address = tuple(0 if d == 1 else s for d, s in zip(shape, strides, strict=True))
    norm = None if operation == "all_reduce" else (id(weight), epsilon)
    return (operation, tuple(shape), dtype, address, norm)


class StandinDeclaredPlanIndex:
    """Stand-in for ``b12x.comm.pcie.DeclaredPlanIndex``: the spec's dict index."""

    def __init__(self) -> None:
        self._map: dict[Any, Any] = {}
        self._weights: list[Any] = []
        self._declared: list[str] = []

    def rebuild(self, pairs) -> None:
        fresh, weights, declared = {}, [], []
        for inv, plan in pairs:
            strides = inv.strides if inv.strides is not None else _contiguous(inv.shape)
            key = _key(inv.operation, inv.shape, inv.dtype, strides, inv.norm_weight, inv.epsilon)
            fresh.setdefault(key, plan)
            weights.append(inv.norm_weight)
            declared.append(f"{inv.operation}{tuple(inv.shape)}")
        self._map, self._weights, self._declared = fresh, weights, declared

    def lookup(self, tensor, operation="all_reduce", weight=None, epsilon=None):
        key = _key(operation, tensor.shape, tensor.dtype, tensor.stride(), weight, epsilon)
        return self._map.get(key)

    def has_plan_for(self, tensor, operation="all_reduce", weight=None, epsilon=None) -> bool:
        return self.lookup(tensor, operation, weight, epsilon) is not None

    def plan_for(self, tensor, operation="all_reduce", weight=None, epsilon=None):
        plan = self.lookup(tensor, operation, weight, epsilon)
        if plan is None:
            raise UndeclaredPlanError(
                f"no declared plan for {operation} on shape {tuple(tensor.shape)} "
                f"{tensor.dtype} strides {tuple(tensor.stride())}; declared: "
                + ", ".join(self._declared)
            )
        return plan

    def clear(self) -> None:
        self._map, self._weights, self._declared = {}, [], []

    def __len__(self) -> int:
        return len(self._map)


def pcie_or_standin() -> Any:
    """``b12x.comm.pcie``'s names, each from the real module when it has it."""
    real = _real("b12x.comm.pcie")
    return SimpleNamespace(
        Invocation=getattr(real, "Invocation", StandinInvocation),
        DeclaredPlanIndex=getattr(real, "DeclaredPlanIndex", StandinDeclaredPlanIndex),
        UndeclaredPlanError=UndeclaredPlanError,
        AllReduce=getattr(real, "AllReduce", None),
    )


def runtime_module_or_none() -> Any:
    """``b12x.comm.pcie.allreduce`` (Limits, route) once branch `collectives` is in."""
    return _real("b12x.comm.pcie.allreduce")


@dataclass(eq=False)
class FakePlan:
    """What the runtime double prepares per distinct declaration."""

    route: str
    key: Any
    names: list[str] = field(default_factory=list)


class FakeRuntime:
    """The ``b12x.comm.pcie.AllReduce`` double: records calls, sums by world size.

    ``routes`` maps a declaration name to its route, or to None when the
    runtime declines it; unnamed ones take ``oneshot`` / ``oneshot_fused``.
    Equal declarations (route, shape, dtype, strides) share one plan.
    """

    def __init__(self, world_size: int = 2, routes: dict[str, str | None] | None = None) -> None:
        self.world_size = world_size
        self.enabled = True
        self.disabled_reason = None
        self.routes = routes or {}
        self.declared: list[list[Any]] = []
        self.declared_plans: list[tuple[Any, FakePlan]] = []
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.in_capture = False
        self.captures = 0
        self.closed = 0

    def declare(self, invocations) -> None:
        invocations = list(invocations)
        self.declared.append(invocations)
        shared: dict[Any, FakePlan] = {}
        self.declared_plans = []
        for inv in invocations:
            default = "oneshot" if inv.operation == "all_reduce" else "oneshot_fused"
            route = self.routes.get(inv.name, default)
            if route is None:
                continue
            key = (route, inv.shape, inv.dtype, inv.strides)
            plan = shared.setdefault(key, FakePlan(route, key))
            plan.names.append(inv.name)
            self.declared_plans.append((inv, plan))

    def all_reduce(self, inp, out=None):
        self.calls.append(("all_reduce", (inp, out)))
        result = inp * self.world_size
        if out is None:
            return result
        out.copy_(result)
        return out

    def fused_add_rms_norm(self, inp, residual, weight, eps, out=None, residual_out=None):
        self.calls.append(("fused", (inp, residual, weight, eps, out, residual_out)))
        return inp, residual

    @contextlib.contextmanager
    def capture(self):
        self.captures += 1
        self.in_capture = True
        try:
            yield
        finally:
            self.in_capture = False

    def close(self) -> None:
        self.closed += 1
        self.enabled = False
