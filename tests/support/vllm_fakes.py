"""Small fakes for the vLLM adapters: no vLLM, no GPU.

* vLLM's side: a forward context, indexer metadata, a workspace manager that
  counts ``get_simultaneous`` calls, a cache holder.
* b12x's side: a counting wrapper around the indexer module, and doubles of
  the all-reduce runtime that record every call (the real runtime needs
  GPUs): :class:`FakeRuntime` (no process group) and :class:`GlooRuntime`
  (sums over a gloo group, for real vLLM ranks on CPU). Both declare and
  admit through b12x's own routing and index (:class:`HostRuntime`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from b12x.comm.pcie import PLAIN, DeclaredPlans, Limits

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


def module_copy(module: Any, **overrides: Any) -> Any:
    """A namespace with ``module``'s names, some replaced (to fake a misbehaving library)."""
    names = {name: getattr(module, name) for name in dir(module) if not name.startswith("__")}
    return SimpleNamespace(**{**names, **overrides})


# --- the all-reduce side ------------------------------------------------------------------


def _dense(t: torch.Tensor) -> bool:
    """Covers its elements exactly once in some dimension order (size-1 dims aside)."""
    step = 1
    for stride, size in sorted((s, d) for d, s in zip(t.shape, t.stride(), strict=True) if d != 1):
        if stride != step:
            return False
        step *= size
    return True


def _host_operand(plan: Any, device: torch.device, t: Any) -> bool:
    """Whether ``t`` is an operand the launch of ``plan`` accepts on ``device``:
    b12x-core's ``bind`` rule (dtype, device, 16-byte address, element count,
    dense for the one-shot, row-major otherwise) for a host tensor."""
    if not isinstance(t, torch.Tensor) or str(t.dtype).removeprefix("torch.") != plan.dtype:
        return False
    numel = 1
    for d in plan.shape:
        numel *= d
    layout = _dense(t) if plan.route == "oneshot" else t.is_contiguous()
    return t.device == device and t.data_ptr() % 16 == 0 and t.numel() == numel and layout


class HostRuntime(DeclaredPlans):
    """What the doubles of ``b12x.comm.pcie.AllReduce`` share: b12x's own
    declaring (routing, real ``AllReducePlan`` objects, equal declarations
    sharing one, the Rust ``DeclaredPlanIndex``), and the runtime's
    ``admit`` on a host ``device``.

    The real ``admit`` is one Rust call: the exact-key lookup in that index,
    then the checks a launch makes that the key cannot (b12x-core's
    ``admit_plain`` / ``admit_fused``), on a CUDA device. Here the lookup is
    the same index's; the launch checks are the same rules read from the plan,
    for host tensors (:func:`_host_operand`). The slot always fits: plans come
    from this runtime's own limits and world, as in the real one.
    """

    def __init__(self, world_size: int, limits: Any, device: Any = "cpu") -> None:
        super().__init__(world_size, limits, multiprocessors=132)
        self.device = torch.device(device)
        self.enabled = True
        self.disabled_reason: str | None = None
        self.admissions = 0  # admit() calls
        self.closed = 0

    def admit(self, inp, operation=PLAIN, weight=None, epsilon=None, residual=None, out=None):
        self.admissions += 1
        if not self.enabled:
            return None
        try:
            plan = self.index.lookup(inp, operation, weight, epsilon)
        except Exception:  # admit never raises: input with no key declines
            return None
        if plan is None or plan.world != self.world_size:
            return None
        if plan.operation == PLAIN:
            return plan if _host_operand(plan, self.device, inp) else None
        out = inp if out is None else out
        operands = (inp, residual, out)  # residual_out = residual
        if not all(_host_operand(plan, self.device, t) for t in operands):
            return None
        weight_ok = (
            weight.dtype == inp.dtype
            and weight.device == self.device
            and tuple(weight.shape) == (plan.shape[-1],)
            and weight.is_contiguous()
            and weight.data_ptr() % 16 == 0
        )
        # epsilon is part of the key, so it is the declared one (>= 0)
        return plan if weight_ok and out.data_ptr() != residual.data_ptr() else None

    def close(self) -> None:
        self.closed += 1
        self.enabled = False
        self.clear()


class FakeRuntime(HostRuntime):
    """The ``b12x.comm.pcie.AllReduce`` double: records calls, sums by world size.

    Declarations are b12x's own (:class:`HostRuntime`), except that names in
    ``refuse`` are declined as a runtime declines what it cannot route.
    """

    def __init__(self, world_size: int = 2, refuse=(), limits=None, device="cpu") -> None:
        super().__init__(world_size, Limits() if limits is None else limits, device)
        self.refuse = set(refuse)
        self.declared: list[list[Any]] = []  # the invocations of each declare() call
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.in_capture = False
        self.captures = 0
        self.plans_passed: list[Any] = []  # the plan= each run call got

    def declare(self, invocations):
        invocations = list(invocations)
        self.declared.append(invocations)
        return super().declare(inv for inv in invocations if inv.name not in self.refuse)

    def all_reduce(self, inp, out=None, *, plan=None):
        self.calls.append(("all_reduce", (inp, out)))
        self.plans_passed.append(plan)
        result = inp * self.world_size
        if out is None:
            return result
        out.copy_(result)
        return out

    def fused_add_rms_norm(
        self, inp, residual, weight, eps, out=None, residual_out=None, *, plan=None
    ):
        self.calls.append(("fused", (inp, residual, weight, eps, out, residual_out)))
        self.plans_passed.append(plan)
        return inp, residual

    @contextlib.contextmanager
    def capture(self):
        self.captures += 1
        self.in_capture = True
        try:
            yield
        finally:
            self.in_capture = False


class GlooRuntime(HostRuntime):
    """The IPC runtime's stand-in for vLLM ranks on CPU (the real one needs GPUs).

    Declarations and admission as :class:`HostRuntime`; only the execution
    is replaced: sums over the gloo ``group`` instead of IPC kernels, the
    fused op in fp32 as the kernel does. Records every call.
    ``enabled=False`` with ``disabled_reason`` plays a runtime that disabled
    itself during set-up (an unsupported GPU, a failed peer mapping).
    """

    def __init__(self, group, limits=None, *, enabled=True, disabled_reason=None) -> None:
        import torch.distributed as dist

        super().__init__(
            dist.get_world_size(group), Limits.from_env() if limits is None else limits
        )
        self.group = group
        self.enabled = enabled
        self.disabled_reason = disabled_reason
        self.declared_counts: list[int] = []
        self.calls: list[tuple[str, tuple[int, ...]]] = []
        self.captures = 0

    def declare(self, invocations):
        invocations = list(invocations)
        self.declared_counts.append(len(invocations))
        return super().declare(invocations)

    def _sum(self, inp):
        import torch.distributed as dist

        total = inp.clone()
        dist.all_reduce(total, group=self.group)
        return total

    def all_reduce(self, inp, out=None, *, plan=None):
        self.calls.append(("all_reduce", tuple(inp.shape)))
        total = self._sum(inp)
        if out is None:
            return total
        return out.copy_(total)

    def fused_add_rms_norm(
        self, inp, residual, weight, eps, out=None, residual_out=None, *, plan=None
    ):
        self.calls.append(("fused", tuple(inp.shape)))
        out = inp if out is None else out
        residual_out = residual if residual_out is None else residual_out
        r = self._sum(inp).float() + residual.float()
        normed = r * torch.rsqrt(r.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()
        residual_out.copy_(r)
        out.copy_(normed)
        return out, residual_out

    @contextlib.contextmanager
    def capture(self):
        self.captures += 1
        yield
