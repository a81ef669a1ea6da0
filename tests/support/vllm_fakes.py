"""Small fakes for the vLLM adapters: no vLLM, no GPU.

* vLLM's side: a forward context, indexer metadata, a workspace manager that
  counts ``get_simultaneous`` calls, a cache holder.
* b12x's side: a counting wrapper around the indexer module, and the
  all-reduce runtime over its host stand-in (the real runtime needs GPUs):
  :class:`FakeRuntime`, b12x's own ``AllReduce`` (declaring, admission,
  bind, health read) whose device side is Python and records every call,
  summing by world size or over a gloo group (:func:`gloo_runtime`, for
  real vLLM ranks on CPU).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from b12x.comm.pcie import AllReduce, Limits
from b12x.comm.pcie.allreduce import decline

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


def _rms_norm_sum(summed: torch.Tensor, residual: torch.Tensor, weight, eps):
    """``(normed, residual + summed)`` in fp32 math, as the fused kernel computes them."""
    r = summed.float() + residual.float()
    return r * torch.rsqrt(r.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float(), r


class FakeRuntime(AllReduce):
    """The real ``b12x.comm.pcie.AllReduce`` over its host stand-in (declaring,
    admission, bind and health read are b12x's own; no process group, no GPU),
    whose device side sums by world size in Python and records every call.

    Names in ``refuse`` are declined as a runtime declines what it cannot
    route. ``admissions`` counts admit calls (a wrapper around the native
    admission, for the tests that count them).
    """

    @classmethod
    def make(cls, world_size=2, refuse=(), limits=None, device="cpu", *, sum_group=None):
        self = cls.host_stand_in(
            world_size,
            limits=Limits() if limits is None else limits,
            device=device,
            on_launch=lambda call: self._device_side(call),
        )
        self.refuse = set(refuse)
        self.sum_group = sum_group
        self.declared: list[list[Any]] = []  # the invocations of each declare() call
        self.calls: list[tuple[str, Any]] = []
        self.in_capture = False
        self.captures = 0
        self.closed = 0
        self.admissions = 0
        native = self.admit

        def admit(*args, **kwargs):
            self.admissions += 1
            return native(*args, **kwargs)

        self.admit = admit
        return self

    def _sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.sum_group is None:
            return x * self.world_size
        import torch.distributed as dist

        total = x.clone()
        dist.all_reduce(total, group=self.sum_group)
        return total

    def _device_side(self, call) -> None:
        """What the kernel would do for ``call``."""
        fused = call.fused_operands
        if fused is None:
            self.calls.append(("all_reduce", call.inp))
            call.out.copy_(self._sum(call.inp))
            return
        residual, weight, residual_out = fused
        self.calls.append(("fused", (call.inp, residual, weight, call.out, residual_out)))
        eps = call.epsilon
        normed, summed = _rms_norm_sum(self._sum(call.inp), residual, weight, eps)
        residual_out.copy_(summed)
        call.out.copy_(normed)

    def declare(self, invocations):
        invocations = list(invocations)
        self.declared.append(invocations)
        return super().declare(inv for inv in invocations if inv.name not in self.refuse)

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
        super().close()


def gloo_runtime(group, limits=None, *, enabled=True, disabled_reason=None) -> FakeRuntime:
    """The IPC runtime's stand-in for vLLM ranks on CPU (the real one needs
    GPUs): :class:`FakeRuntime` whose device side sums over the gloo ``group``.
    ``enabled=False`` with ``disabled_reason`` plays a runtime that disabled
    itself during set-up (an unsupported GPU, a failed peer mapping)."""
    import torch.distributed as dist

    runtime = FakeRuntime.make(
        dist.get_world_size(group),
        limits=Limits.from_env() if limits is None else limits,
        sum_group=group,
    )
    if not enabled:  # as a failed set-up leaves it (that set-up logs; this one is silent)
        runtime.enabled, runtime.disabled_reason = False, disabled_reason
        runtime.admit = decline
    return runtime
