"""The PCIe all-reduce adapter for vLLM's tensor-parallel group.

It sits where vLLM's custom all-reduce sits and keeps its method names
(``should_custom_ar``, ``custom_all_reduce``, ``all_reduce``, ``capture``,
``close``, ``disabled``). Every live call either finds a declared, prepared
plan in constant time or declines (``False`` / ``None``) so vLLM falls through
to the next backend (NCCL):

1. **Declare.** Model layers register *describers* (``describe(workload) ->
   [Invocation, ...]``); owners are held weakly and re-registering an owner
   replaces its describer. :meth:`PcieAllReduce.prepare` collects every
   declaration (duplicate names are an error) and hands them to the runtime
   (:class:`b12x.comm.pcie.AllReduce`), which routes each one by size
   (one-shot, fused one-shot, two-shot, or none), prepares one plan per
   distinct declaration and indexes them. The adapter keeps no index of its
   own.
2. **Admit.** :meth:`admit` (behind :meth:`should_custom_ar` and
   :meth:`try_fused_add_rms_norm`) is one call into the runtime's Rust
   admission: the exact-key lookup (operation, shape, dtype, address
   strides, norm weight identity and epsilon), then what the key cannot fix
   (device, 16-byte addresses, the fused call's other operands); anything
   else declines.
3. **Run** the admitted plan (``plan=``) through the runtime on torch's
   current stream (the capture stream inside a CUDA graph capture).

Inside vLLM, :class:`~b12x.integration.vllm.communicator.B12xCustomAllreduce`
builds this adapter from vLLM's own call and registers a describer derived from
the vLLM config (:mod:`b12x.integration.vllm.declarations`), so nothing in the
model declares anything.

Routing limits are the runtime's (:class:`b12x.comm.pcie.Limits`, from the
``VLLM_PCIE_*`` environment knobs unless given). Without a live runtime (no
process group, CPU only, or one that disabled itself) declarations go to a
:class:`b12x.comm.pcie.DeclaredPlans` under those limits instead, the same
routing and index, so :meth:`has_plan_for` answers, but nothing executes and
every admission declines.
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

from b12x.comm.pcie import FUSED, PLAIN, AllReduce, AllReducePlan, DeclaredPlans, Limits
from b12x.errors import ConfigError

__all__ = [
    "FUSED",
    "PLAIN",
    "PcieAllReduce",
    "add_rms_norm_",
    "register_collective_describer",
]

logger = logging.getLogger(__name__)

_logged: set[str] = set()


def _log_once(level: int, message: str, *args: Any) -> None:
    """Logs ``message % args`` the first time this process sees that text."""
    text = message % args if args else message
    if text not in _logged:
        _logged.add(text)
        logger.log(level, text)


def _build_runtime(group: Any, device: Any, limits: Any) -> Any:
    """Builds the IPC runtime collectively over ``group`` (every rank calls this)."""
    return AllReduce(group, device=device, limits=limits)


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
    """vLLM-facing all-reduce over the b12x IPC runtime and its declared plans.

    Parameters
    ----------
    group
        The TP group's process group; the runtime is built collectively over
        it. None: no runtime (routing only).
    device
        This rank's CUDA device.
    world_size
        Ranks in the group; defaults to the runtime's or the group's size.
    runtime
        An already-built runtime to use instead of building one.
    limits
        Route byte ceilings (:class:`b12x.comm.pcie.Limits`); default
        ``Limits.from_env(env)``.
    env
        Where the limits are read from (default ``os.environ``).

    If the runtime cannot be built or disables itself, so does the adapter
    (logged once per reason, no exception): every admission declines to the
    next backend.
    """

    def __init__(
        self,
        group: Any = None,
        device: Any = None,
        *,
        world_size: int | None = None,
        runtime: Any = None,
        limits: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if limits is None and runtime is None:
            limits = Limits.from_env(env)
        if world_size is None:
            if runtime is not None:
                world_size = int(runtime.world_size)
            elif group is not None:
                world_size = int(group.size())
            else:
                world_size = 1
        self.world_size = world_size
        self.limits = limits if limits is not None else getattr(runtime, "limits", None)
        self._describers: list[list[Any]] = []
        self._capturing = False
        if runtime is None and group is not None:
            try:
                runtime = _build_runtime(group, self.device, self.limits)
            except Exception as e:  # the runtime agrees its verdict over the group itself
                _log_once(logging.WARNING, "b12x PCIe all-reduce disabled: %s", e)
                runtime = None
        self.runtime = runtime
        self.disabled = runtime is None or not runtime.enabled
        if runtime is not None and self.disabled:
            _log_once(
                logging.WARNING,
                "b12x PCIe all-reduce disabled: %s",
                getattr(runtime, "disabled_reason", None),
            )
        # Where declarations go and admissions are made: the live runtime
        # itself, else a routing-only set under the same limits.
        self._declared: Any = runtime if not self.disabled else self._routing_only()

    def _routing_only(self) -> DeclaredPlans:
        limits = self.limits if self.limits is not None else Limits()
        return DeclaredPlans(self.world_size, limits)

    # --- describers and declaration ------------------------------------------------------

    def register_describer(self, owner: Any, describe: Callable[[Any], Sequence[Any]]) -> None:
        """Registers (or replaces) ``owner``'s describer; ``owner`` is held weakly.

        A bound method of ``owner`` is held weakly too, so registering never
        keeps a layer alive. Dead owners are dropped at the next :meth:`prepare`.
        """
        held: object = describe
        if inspect.ismethod(describe) and describe.__self__ is owner:
            held = weakref.WeakMethod(describe)
        for entry in self._describers:
            if entry[0]() is owner:
                entry[1] = held
                return
        self._describers.append([weakref.ref(owner), held])

    def _live_describers(self) -> list[Callable[[Any], Sequence[Any]]]:
        live, kept = [], []
        for entry in self._describers:
            owner, describe = entry[0](), entry[1]
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
        Collective: every rank must call it with the same declarations.
        """
        if getattr(workload, "stage", "weights") != "weights":
            return {}
        self.declare(self.collect(workload))
        return self._routes

    def declare(self, invocations: Sequence[Any]) -> None:
        """Hands ``invocations`` to the runtime, which routes them, prepares
        plans (equal declarations share one) and replaces its index snapshot.
        Without a live runtime they are routed the same way and indexed, for
        :meth:`has_plan_for`."""
        self._declared.declare(list(invocations))

    @property
    def declared_plans(self) -> list[tuple[Any, AllReducePlan]]:
        """(invocation, plan) of every routed declaration, in declaration order."""
        return list(self._declared.declared_plans)

    # The declared plans by declaration name (the reference adapter's names).
    @property
    def _routes(self) -> dict[str, str]:
        return {inv.name: plan.route for inv, plan in self._declared.declared_plans}

    @property
    def _plans(self) -> dict[str, Any]:
        return {inv.name: plan for inv, plan in self._declared.declared_plans}

    @property
    def _invocations(self) -> dict[str, Any]:
        return {inv.name: inv for inv, _ in self._declared.declared_plans}

    @property
    def _index(self) -> Any:
        """The one index of the declared plans (the runtime's, if live)."""
        return self._declared.index

    # --- lookups -------------------------------------------------------------------------

    def has_plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> bool:
        """Whether ``inp`` matches a declared, routed plan. Never raises."""
        return self._declared.has_plan_for(inp, operation, weight, epsilon)

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
        return self._declared.plan_for(inp, operation, weight, epsilon)

    _has_plan_for = has_plan_for  # the reference adapter's names
    _plan_for = plan_for

    # --- admission and dispatch ---------------------------------------------------------

    def admit(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> Any:
        """The declared plan of this call if it runs on b12x, else None; never raises.

        One call into the runtime's admission (:meth:`b12x.comm.pcie.AllReduce.admit`):
        the exact-key lookup, then device, 16-byte alignment and, for
        :data:`FUSED`, ``residual``, ``weight`` and ``out`` (None: in place).
        Pass the plan on (``plan=``) so the run does not look it up again.
        """
        plan: Any = self._declared.admit(inp, operation, weight, epsilon, residual, out)
        return plan

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """True when :meth:`custom_all_reduce` will take ``inp`` (declared, on a route)."""
        return self.admit(inp) is not None

    def custom_all_reduce(self, inp: torch.Tensor, *, plan: Any = None) -> torch.Tensor | None:
        """The all-reduced ``inp`` (a new tensor), or None to decline to the next backend.

        ``plan``: what :meth:`admit` returned for ``inp``, when the caller already
        admitted it; None admits here.
        """
        runtime = self.runtime
        if plan is None:
            plan = self.admit(inp)
        if plan is None or runtime is None:
            return None
        out: torch.Tensor = runtime.all_reduce(inp, plan=plan)
        return out

    def all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """All-reduces ``inp`` on its declared plan into ``out`` (default: a new tensor).

        Raises
        ------
        b12x.errors.UndeclaredPlanError
            If ``inp`` was not declared; :class:`b12x.errors.ConfigError` when
            the adapter is disabled.
        """
        if self.disabled:
            raise ConfigError("PcieAllReduce.all_reduce: runtime expected enabled, got disabled")
        plan = self.plan_for(inp)  # the precise error for an undeclared call
        result: torch.Tensor = self.runtime.all_reduce(inp, out, plan=plan)
        return result

    def supports_fused_add_rms_norm(self) -> bool:
        """Whether fused calls can be offered at all (the probe vLLM code gates on).

        True while the runtime is enabled and the fused route has a nonzero
        ceiling; each call is still admitted only on a declared plan.
        """
        return not self.disabled and self.limits is not None and self.limits.fused_max > 0

    def try_fused_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        epsilon: float,
        out: torch.Tensor | None = None,
    ) -> bool:
        """All-reduce + residual add + RMSNorm, if declared; else False.

        On True: ``residual <- all_reduce(inp) + residual`` in place and
        ``out <- rms_norm(residual) * weight`` (``out`` defaults to ``inp``,
        in place; else a tensor like ``inp``, not aliasing it). On False
        nothing was touched and the caller runs its fallback.
        """
        plan = self.admit(inp, FUSED, weight, epsilon, residual, out)
        if plan is None:
            return False
        self.runtime.fused_add_rms_norm(inp, residual, weight, epsilon, out, plan=plan)
        return True

    def fused_all_reduce_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        epsilon: float,
        fallback_all_reduce: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        """The fused op with its fallback: the same observable result either way.

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
        """Context around a CUDA graph capture; never refuses to open.

        vLLM enters it (``ca_comm.capture()``) for every TP group at every
        graph capture, declared or not. With nothing declared (or no runtime)
        it is a no-op and every captured call declines to the next backend.
        ``stream``: the capture stream (default: torch's current one, which
        vLLM has already set); kernels launch on it. The previous state comes
        back on exit, also when the body raises.
        """
        if self.disabled or len(self._index) == 0:
            if not self.disabled:
                _log_once(
                    logging.INFO,
                    "b12x all-reduce: nothing declared at graph capture; captured "
                    "all-reduces run on vLLM's own backends",
                )
            yield
            return
        previous = self._capturing
        self._capturing = True
        try:
            with contextlib.ExitStack() as scope:
                if stream is not None:
                    scope.enter_context(torch.cuda.stream(stream))
                scope.enter_context(self.runtime.capture())
                yield
        finally:
            self._capturing = previous

    def close(self) -> None:
        """Releases the runtime and forgets every declaration; idempotent."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
        self.disabled = True
        self._declared = self._routing_only()
