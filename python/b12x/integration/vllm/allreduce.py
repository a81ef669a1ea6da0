"""The PCIe all-reduce adapter for vLLM's tensor-parallel group.

It sits where vLLM's custom all-reduce sits and keeps its method names
(``should_custom_ar``, ``custom_all_reduce``, ``all_reduce``, ``capture``,
``close``, ``disabled``). Every live call either finds a declared, prepared
plan in constant time or declines (``False`` / ``None``) so vLLM falls through
to the next backend (NCCL):

1. **Declare.** Model layers register *describers* (``describe(workload) ->
   [Invocation, ...]``); owners are held weakly and re-registering an owner
   replaces its describer. :meth:`PcieAllReduce.prepare` collects every
   declaration (duplicate names are an error), routes each one by size
   (one-shot, fused one-shot, two-shot, or none), asks the runtime for plans
   and rebuilds the declared-plan index as one snapshot.
2. **Admit.** :meth:`should_custom_ar` / :meth:`try_fused_add_rms_norm` look the
   live tensor up by (operation, shape, dtype, address strides, norm weight
   identity and epsilon); anything undeclared declines.
3. **Run** on the plan's route, on the capture stream while capturing.

Without a runtime (no process group, CPU only) declarations are still routed
and indexed, so :meth:`has_plan_for` answers, but nothing executes and every
admission declines.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from b12x.errors import ConfigError, UndeclaredPlanError
from b12x.integration.vllm.limits import Limits

__all__ = [
    "FUSED",
    "PLAIN",
    "PcieAllReduce",
    "add_rms_norm_",
    "register_collective_describer",
    "route_invocation",
]

logger = logging.getLogger(__name__)

PLAIN = "all_reduce"
FUSED = "all_reduce_fused_add_rms_norm"
ONESHOT, ONESHOT_FUSED, TWOSHOT = "oneshot", "oneshot_fused", "twoshot"


def _pcie() -> Any:
    """The library module (tests swap in a stand-in here)."""
    from b12x.comm import pcie

    return pcie


def _build_runtime(group: Any, device: torch.device, limits: Limits) -> Any:
    """Builds the IPC runtime collectively over ``group`` (every rank calls this)."""
    # TODO(collectives): match AllReduce's constructor once branch `collectives` lands.
    return _pcie().AllReduce(
        group,
        device=device,
        oneshot_max_bytes=limits.oneshot_max,
        fused_max_bytes=limits.fused_max,
        twoshot_max_bytes=limits.twoshot_max,
        twoshot_row_elems=limits.twoshot_row_elems,
    )


# --- routing ------------------------------------------------------------------------


def _row_major(shape: Sequence[int], strides: Sequence[int] | None) -> bool:
    if strides is None:
        return True
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides), strict=True):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True


def route_invocation(invocation: Any, world_size: int, limits: Limits) -> str | None:
    """The route of one declaration, or None when no b12x kernel serves it.

    * plain: ``oneshot`` up to ``limits.oneshot_max`` bytes; above it ``twoshot``
      for bf16, row-major, ``numel % (world * row_elems) == 0`` up to
      ``limits.twoshot_max``; else None.
    * fused add + RMSNorm: ``oneshot_fused`` up to ``limits.fused_max``; else None.
    """
    # TODO(collectives): call the runtime's routing (rust/core allreduce::route)
    # once it is exposed to Python, so the rule lives in one place.
    numel = 1
    for size in invocation.shape:
        numel *= size
    nbytes = numel * invocation.dtype.itemsize
    if invocation.operation == FUSED:
        return ONESHOT_FUSED if nbytes <= limits.fused_max else None
    if nbytes <= limits.oneshot_max:
        return ONESHOT
    if (
        limits.twoshot_max > 0
        and invocation.dtype == torch.bfloat16
        and nbytes <= limits.twoshot_max
        and _row_major(invocation.shape, invocation.strides)
        and numel % (world_size * limits.twoshot_row_elems) == 0
    ):
        return TWOSHOT
    return None


# --- the fused fallback ---------------------------------------------------------------


def add_rms_norm_(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> None:
    """vLLM's ``fused_add_rms_norm`` in torch, in place.

    ``residual <- x + residual`` (rounded to the dtype), then
    ``x <- residual * rsqrt(mean(residual^2) + eps) * weight``.
    """
    residual.add_(x)
    r = residual.float()
    inv = torch.rsqrt(r.pow(2).mean(dim=-1, keepdim=True) + epsilon)
    x.copy_(r * inv * weight.float())


def register_collective_describer(
    communicator: Any, owner: Any, describe: Callable[[Any], Sequence[Any]]
) -> bool:
    """Registers ``owner``'s describer if ``communicator`` is a :class:`PcieAllReduce`.

    Returns False (and does nothing) for any other communicator, so model code
    can call it unconditionally.
    """
    if not isinstance(communicator, PcieAllReduce):
        return False
    communicator.register_describer(owner, describe)
    return True


# --- the adapter ----------------------------------------------------------------------


class PcieAllReduce:
    """vLLM-facing all-reduce over the b12x IPC runtime, with a declared-plan index.

    Parameters
    ----------
    group
        The TP group's device (NCCL) process group; the runtime is built
        collectively over it. None: no runtime (index only).
    device
        This rank's CUDA device.
    world_size
        Ranks in the group; defaults to the runtime's or the group's size.
    runtime
        An already-built runtime to use instead of building one.
    limits
        Route byte ceilings; default :meth:`Limits.from_env`.
    env
        Where :meth:`Limits.from_env` reads the knobs (default ``os.environ``).

    If the runtime cannot be built, the adapter is disabled (logged, no
    exception): every admission declines to the next backend.
    """

    def __init__(
        self,
        group: Any = None,
        device: Any = None,
        *,
        world_size: int | None = None,
        runtime: Any = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if world_size is None:
            if runtime is not None:
                world_size = int(runtime.world_size)
            elif group is not None:
                world_size = int(group.size())
            else:
                world_size = 1
        self.world_size = world_size
        self.limits = limits if limits is not None else Limits.from_env(world_size, env)
        self._describers: list[list[Any]] = []
        self._invocations: dict[str, Any] = {}
        self._plans: dict[str, Any] = {}
        self._routes: dict[str, str] = {}
        self._route_of_plan: dict[int, str] = {}
        self._index: Any = None
        self._capturing = False
        self._capture_stream: Any = None
        if runtime is None and group is not None:
            try:
                runtime = _build_runtime(group, self.device, self.limits)
            except Exception as e:  # every rank reaches the same verdict inside the runtime
                logger.warning("b12x PCIe all-reduce disabled: %s", e)
                runtime = None
        self.runtime = runtime
        self.disabled = runtime is None or bool(getattr(runtime, "disabled", False))

    # --- describers and declaration ------------------------------------------------------

    def register_describer(self, owner: Any, describe: Callable[[Any], Sequence[Any]]) -> None:
        """Registers (or replaces) ``owner``'s describer; ``owner`` is held weakly.

        A bound method of ``owner`` is held weakly too, so registering never
        keeps a layer alive. Dead owners are dropped at the next :meth:`prepare`.
        """
        if inspect.ismethod(describe) and describe.__self__ is owner:
            describe = weakref.WeakMethod(describe)
        for entry in self._describers:
            if entry[0]() is owner:
                entry[1] = describe
                return
        self._describers.append([weakref.ref(owner), describe])

    def _live_describers(self) -> list[Callable[[Any], Sequence[Any]]]:
        live = []
        kept = []
        for entry in self._describers:
            owner = entry[0]()
            describe = entry[1]
            if isinstance(describe, weakref.WeakMethod):
                describe = describe()
            if owner is None or describe is None:
                continue
            kept.append(entry)
            live.append(describe)
        self._describers = kept
        return live

    def collect(self, workload: Any) -> list[Any]:
        """Every live describer's invocations for ``workload``, in registration order.

        Raises
        ------
        b12x.errors.ConfigError
            (a ValueError) If two invocations share a name.
        """
        invocations = [inv for describe in self._live_describers() for inv in describe(workload)]
        counts = Counter(inv.name for inv in invocations)
        duplicates = sorted(name for name, n in counts.items() if n > 1)
        if duplicates:
            raise ConfigError(
                "PcieAllReduce.prepare: invocation names expected unique, got duplicates "
                + ", ".join(duplicates)
            )
        return invocations

    def prepare(self, workload: Any = None) -> dict[str, str]:
        """Declares what the describers produce for ``workload``; returns name -> route.

        Only the ``"weights"`` stage (or a workload without a stage) declares.
        Undeclared or unrouted shapes decline at run time. Collective: every
        rank must call it with the same declarations.
        """
        if getattr(workload, "stage", "weights") != "weights":
            return {}
        self.declare(self.collect(workload))
        return dict(self._routes)

    def declare(self, invocations: Sequence[Any]) -> None:
        """Routes ``invocations``, prepares plans and replaces the index snapshot."""
        routed = []
        for inv in invocations:
            route = route_invocation(inv, self.world_size, self.limits)
            if route is not None:
                routed.append((inv, route))
        if self.runtime is not None and not self.disabled:
            # TODO(collectives): AllReduce.declare's return shape; assumed one plan
            # (or None: the runtime declines) per invocation, equal keys sharing one.
            plans = list(self.runtime.declare([inv for inv, _ in routed]))
        else:
            plans = [route for _, route in routed]  # index only: a plan is its route name
        self._invocations = {}
        self._plans = {}
        self._routes = {}
        for (inv, route), plan in zip(routed, plans, strict=True):
            if plan is None:
                continue
            self._invocations[inv.name] = inv
            self._plans[inv.name] = plan
            self._routes[inv.name] = route
        self._index_declared_plans()

    def _index_declared_plans(self) -> None:
        """Rebuilds the index from ``_invocations`` / ``_plans``: first declaration wins."""
        if self._index is None:
            self._index = _pcie().DeclaredPlanIndex()
        pairs = [(inv, self._plans[name]) for name, inv in self._invocations.items()]
        self._index.rebuild(pairs)
        self._route_of_plan = {
            id(self._plans[name]): route for name, route in reversed(self._routes.items())
        }

    # --- lookups -------------------------------------------------------------------------

    def _lookup_plan(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> Any:
        if self._index is None:
            return None
        return self._index.lookup(inp, operation, weight, epsilon)

    def has_plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> bool:
        """Whether ``inp`` matches a declared, routed plan. Never raises."""
        index = self._index
        if index is not None and index.lookup(inp, operation, weight, epsilon) is not None:
            return True
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "b12x PCIe all-reduce declines undeclared shape %s %s",
                tuple(inp.shape),
                inp.dtype,
            )
        return False

    def plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> Any:
        """The declared plan for ``inp``.

        Raises
        ------
        b12x.errors.UndeclaredPlanError
            (a RuntimeError) If nothing matching was declared; the message
            names the operation, shape, dtype and strides.
        """
        if self._index is None:
            raise UndeclaredPlanError(
                f"PcieAllReduce: no declared plan for {operation} on shape {tuple(inp.shape)} "
                f"{inp.dtype} strides {tuple(inp.stride())}; declared: nothing"
            )
        return self._index.plan_for(inp, operation, weight, epsilon)

    _has_plan_for = has_plan_for  # the reference adapter's names
    _plan_for = plan_for

    # --- admission and dispatch ---------------------------------------------------------

    def _runtime_stream(self) -> Any:
        """The capture stream while capturing on it, else None (the runtime's default)."""
        if self._capturing and self._current_stream() == self._capture_stream:
            return self._capture_stream
        return None

    def _current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def _admit(self, inp: torch.Tensor, operation: str, weight: Any, epsilon: Any) -> Any:
        index = self._index
        if self.disabled or index is None:
            return None
        plan = index.lookup(inp, operation, weight, epsilon)
        if plan is None:
            return None
        # The key fixes shape, dtype and strides; the address and device are live.
        if inp.device != self.device or inp.data_ptr() % 16:
            return None
        return plan

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """True when :meth:`custom_all_reduce` will take ``inp`` (declared, on a route)."""
        return self._admit(inp, PLAIN, None, None) is not None

    def _run(self, inp: torch.Tensor, plan: Any, out: torch.Tensor | None) -> torch.Tensor:
        if out is None and self._route_of_plan.get(id(plan)) == TWOSHOT:
            out = torch.empty_like(inp)  # two-shot writes a caller-owned output, also in graphs
        return self.runtime.all_reduce(inp, plan=plan, out=out, stream=self._runtime_stream())

    def custom_all_reduce(self, inp: torch.Tensor) -> torch.Tensor | None:
        """The all-reduced ``inp`` (a new tensor), or None to decline to the next backend."""
        plan = self._admit(inp, PLAIN, None, None)
        if plan is None:
            return None
        return self._run(inp, plan, None)

    def all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """All-reduces ``inp`` on its declared plan.

        Raises
        ------
        b12x.errors.UndeclaredPlanError
            If ``inp`` was not declared; :class:`b12x.errors.ConfigError` when
            the adapter is disabled.
        """
        if self.disabled:
            raise ConfigError("PcieAllReduce.all_reduce: runtime expected enabled, got disabled")
        return self._run(inp, self.plan_for(inp), out)

    def try_fused_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        epsilon: float,
    ) -> bool:
        """All-reduce + residual add + RMSNorm in place, if declared; else False.

        On True: ``residual <- all_reduce(inp) + residual`` and
        ``inp <- rms_norm(residual) * weight``, both in place. On False nothing
        was touched and the caller runs its fallback.
        """
        if self.disabled or inp.ndim == 0:
            return False
        if (
            residual.shape != inp.shape
            or residual.dtype != inp.dtype
            or residual.device != inp.device
            or not residual.is_contiguous()
            or weight.ndim != 1
            or weight.shape[0] != inp.shape[-1]
            or weight.dtype != inp.dtype
            or weight.device != inp.device
            or not weight.is_contiguous()
            or inp.data_ptr() == residual.data_ptr()
        ):
            return False
        plan = self._admit(inp, FUSED, weight, epsilon)
        if plan is None:
            return False
        self.runtime.fused_add_rms_norm(
            inp,
            residual,
            weight,
            epsilon,
            plan=plan,
            out=inp,
            residual_out=residual,
            stream=self._runtime_stream(),
        )
        return True

    def fused_all_reduce_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        epsilon: float,
        fallback_all_reduce: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """The fused op with its fallback: same observable result either way.

        Falls back to ``inp <- fallback_all_reduce(inp)`` then
        :func:`add_rms_norm_` when the fast path declines.
        """
        if self.try_fused_add_rms_norm(inp, residual, weight, epsilon):
            return
        inp.copy_(fallback_all_reduce(inp))
        add_rms_norm_(inp, residual, weight, epsilon)

    # --- graphs and teardown ------------------------------------------------------------

    @contextlib.contextmanager
    def capture(self, stream: Any = None) -> Iterator[None]:
        """Context for a CUDA graph capture on ``stream`` (default: the current one).

        While inside, runs on that stream go to the runtime with it; the
        previous state comes back on exit, also when the body raises.

        Raises
        ------
        b12x.errors.UndeclaredPlanError
            If nothing is declared (a capture could only hold cold plans).
        """
        if self.disabled:
            yield
            return
        if not self._plans:
            raise UndeclaredPlanError(
                "PcieAllReduce.capture: declared plans expected before capture, got none"
            )
        if stream is None:
            stream = self._current_stream()
        previous = (self._capturing, self._capture_stream)
        self._capturing, self._capture_stream = True, stream
        try:
            with self.runtime.capture(stream=stream):
                yield
        finally:
            self._capturing, self._capture_stream = previous

    def close(self) -> None:
        """Releases the runtime and forgets every declaration; idempotent."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        self._invocations = {}
        self._plans = {}
        self._routes = {}
        self._route_of_plan = {}
        if self._index is not None:
            self._index.clear()
        self.disabled = True
