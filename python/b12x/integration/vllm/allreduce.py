"""The PCIe all-reduce adapter for vLLM's tensor-parallel group.

It sits where vLLM's custom all-reduce sits and answers to what vLLM calls
on its ``CustomAllreduce`` (``disabled``, ``should_custom_ar``,
``custom_all_reduce``, ``custom_all_gather``, ``custom_reduce_scatter``,
``all_reduce``, ``capture``, ``close``). Every live call either is admitted on
a declared, prepared plan in constant time or declines (``False`` / ``None``)
so vLLM falls through to the next backend (NCCL):

1. **Declare.** Model layers register *describers* (``describe(workload) ->
   [Invocation, ...]``); owners are held weakly and re-registering an owner
   replaces its describer. :meth:`PcieAllReduce.prepare` collects every
   declaration (duplicate names are an error) and declares them in the
   runtime's :class:`~b12x.comm.pcie.DeclaredPlans`
   (:attr:`b12x.comm.pcie.AllReduce.plans`), which routes each one by size
   (one-shot, fused one-shot, two-shot, or none), prepares one plan per
   distinct declaration and indexes them. The adapter keeps no index of its
   own.
2. **Admit** once per call: :attr:`PcieAllReduce.admit` is the runtime's own
   (one native call: one metadata read, the exact-key lookup, one bind by
   b12x-core). :meth:`should_custom_ar` keeps the admitted call for the
   :meth:`custom_all_reduce` vLLM makes next on the same tensor.
3. **Run** the admitted call (``call.run()``) on torch's current stream (the
   capture stream inside a CUDA graph capture).

Inside vLLM, :class:`~b12x.integration.vllm.communicator.B12xCustomAllreduce`
builds this adapter from vLLM's own call and registers a describer derived from
the vLLM config (:mod:`b12x.integration.vllm.declarations`), so nothing in the
model declares anything.

Routing limits are the runtime's (:class:`b12x.comm.pcie.Limits`, from the
``B12X_ALLREDUCE_*`` environment knobs unless given). Without a live runtime
(no process group, CPU only, or one that disabled itself) declarations go to
a :class:`b12x.comm.pcie.DeclaredPlans` under those limits instead, the same
routing and index, so ``plans.has_plan_for`` answers, but nothing executes
and every admission declines.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch

from b12x.comm.pcie import FUSED, PLAIN, AllReduce, AllReduceCall, DeclaredPlans, Limits
from b12x.comm.pcie.allreduce import decline
from b12x.errors import ConfigError
from b12x.integration.vllm._once import log_once

__all__ = [
    "FUSED",
    "PLAIN",
    "PcieAllReduce",
    "add_rms_norm_",
    "register_collective_describer",
]

logger = logging.getLogger(__name__)


def _log_once(level: int, message: str, *args: Any) -> None:
    """:func:`._once.log_once` on this module's logger (the communicator's too)."""
    log_once(logger, level, message, *args)


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
        An already-built runtime (:class:`b12x.comm.pcie.AllReduce`) to use
        instead of building one.
    limits
        Route byte ceilings (:class:`b12x.comm.pcie.Limits`); default
        ``Limits.from_env(env)``.
    env
        Where the limits are read from (default ``os.environ``).
    fallback
        A custom all-reduce that takes what b12x declines (vLLM's own
        ``CustomAllreduce``, in vLLM's slot): its answer for every call b12x
        does not run, its all-gather and reduce-scatter, its capture and close.
    **vllm_options
        What vLLM and the voipmonitor fork pass their custom all-reduce
        besides ``group`` and ``device`` (``device_group``, ``max_size``,
        ``symm_mem_enabled``, ``register_graph_buffers``, ...): accepted, unused.

    If the runtime cannot be built or disables itself, b12x declines every
    call (logged once per reason, no exception) and the fallback, if any,
    takes them. Dropping the adapter closes it, as vLLM's own
    ``CustomAllreduce`` closes in ``__del__``.

    Attributes
    ----------
    runtime
        The live :class:`b12x.comm.pcie.AllReduce`, or None (declined, closed).
    disabled
        True when nothing runs here: no live runtime and no live fallback
        (what vLLM checks before asking ``should_custom_ar``).
    plans
        The declared plans (the runtime's, if live).
    admit
        The runtime's admission (:attr:`b12x.comm.pcie.AllReduce.admit`):
        ``admit(inp, operation=PLAIN, weight=None, epsilon=None,
        residual=None, out=None)`` is the call if it runs on b12x, else None.
    """

    admit: Callable[..., AllReduceCall | None]

    def __init__(
        self,
        group: Any = None,
        device: Any = None,
        *,
        world_size: int | None = None,
        runtime: AllReduce | None = None,
        limits: Limits | None = None,
        env: Mapping[str, str] | None = None,
        fallback: Any = None,
        **vllm_options: Any,
    ) -> None:
        self.runtime: AllReduce | None = None  # until built: close() has nothing to release
        self.fallback = fallback
        self.device = torch.device(device) if device is not None else None
        if self.device is not None and self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if limits is None:
            limits = runtime.limits if runtime is not None else Limits.from_env(env)
        if world_size is None:
            if runtime is not None:
                world_size = runtime.world_size
            elif group is not None:
                world_size = int(group.size())
            else:
                world_size = 1
        self.world_size = world_size
        self.limits = limits
        self._describers: list[list[Any]] = []
        self._pending: tuple[torch.Tensor, AllReduceCall | None] | None = None
        if runtime is None and group is not None:
            try:
                runtime = AllReduce(group, device=self.device, limits=limits)
            except Exception as e:  # the runtime agrees its verdict over the group itself
                _log_once(logging.WARNING, "b12x PCIe all-reduce disabled: %s", e)
                runtime = None
        if runtime is not None and not runtime.enabled:
            _log_once(logging.WARNING, "b12x PCIe all-reduce disabled: %s", runtime.disabled_reason)
            runtime = None
        self._use(runtime)

    def _use(self, runtime: AllReduce | None) -> None:
        """Declarations and admissions go to ``runtime``'s, else a routing-only set."""
        self.runtime = runtime
        self.plans = runtime.plans if runtime is not None else DeclaredPlans(
            self.world_size, self.limits
        )  # fmt: skip
        self.admit = runtime.admit if runtime is not None else decline
        fallback = self.fallback
        self.disabled = runtime is None and (fallback is None or bool(fallback.disabled))

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
        return self.plans.routes()

    def declare(self, invocations: Sequence[Any]) -> None:
        """Declares ``invocations`` in the runtime (without one: in the routing-only
        plans): routed, prepared (equal declarations share one plan) and indexed
        as one snapshot; the declined ones decline at run time."""
        (self.runtime or self.plans).declare(invocations)

    # --- what vLLM calls -----------------------------------------------------------------

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """True when :meth:`custom_all_reduce` will take ``inp`` (b12x's
        admission, else the fallback's answer). The admitted call (or the
        refusal) is kept for the next call on the same tensor, the one vLLM
        makes right after: one admission per all-reduce."""
        call = self.admit(inp)
        if call is not None:
            self._pending = (inp, call)
            return True
        taken = self.fallback is not None and bool(self.fallback.should_custom_ar(inp))
        self._pending = (inp, None) if taken else None  # nothing kept past a decline
        return taken

    def custom_all_reduce(self, inp: torch.Tensor) -> torch.Tensor | None:
        """The all-reduced ``inp`` (a new tensor): b12x's, else the fallback's,
        else None to decline to vLLM's next backend.

        Uses what :meth:`should_custom_ar` admitted for this very tensor (no
        second admission), else admits here.
        """
        pending, self._pending = self._pending, None
        call = pending[1] if pending is not None and pending[0] is inp else self.admit(inp)
        if call is not None:
            out: torch.Tensor = call.run()
            return out
        return None if self.fallback is None else self.fallback.custom_all_reduce(inp)

    def custom_all_gather(self, inp: torch.Tensor) -> torch.Tensor | None:
        """The fallback's all-gather; None (b12x has none) to decline to vLLM's next backend."""
        return None if self.fallback is None else self.fallback.custom_all_gather(inp)

    def custom_reduce_scatter(self, inp: torch.Tensor) -> torch.Tensor | None:
        """The fallback's reduce-scatter; None (b12x has none) to decline."""
        return None if self.fallback is None else self.fallback.custom_reduce_scatter(inp)

    @property
    def fully_connected(self) -> bool:
        """The fallback's flag (vLLM's model code reads it to pick its custom all-gather)."""
        return bool(getattr(self.fallback, "fully_connected", False))

    @property
    def mnnvl_lamport_ag_multicast_ptr(self) -> int:
        """The fallback's multicast buffer (DeepSeek V4.1's fused mHC all-reduce gates on it)."""
        return int(getattr(self.fallback, "mnnvl_lamport_ag_multicast_ptr", 0))

    def all_reduce(self, inp: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """All-reduces ``inp`` on its declared plan into ``out`` (default: a new tensor).

        Raises
        ------
        b12x.errors.UndeclaredPlanError
            If ``inp`` was not declared; :class:`b12x.errors.ConfigError` when
            the adapter is disabled.
        """
        if self.runtime is None:
            raise ConfigError("PcieAllReduce.all_reduce: runtime expected enabled, got disabled")
        return self.runtime.all_reduce(inp, out)

    def supports_fused_add_rms_norm(self) -> bool:
        """Whether fused calls can be offered at all (the probe vLLM code gates on).

        True while the runtime is enabled and the fused route has a nonzero
        ceiling; each call is still admitted only on a declared plan.
        """
        return self.runtime is not None and self.limits.fused_max > 0

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
        call = self.admit(inp, FUSED, weight, epsilon, residual, out)
        if call is None:
            return False
        call.run()
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
        graph capture, declared or not; the fallback's capture is entered
        too. With nothing declared (or no runtime) b12x's part is a no-op and
        every captured call declines to the fallback or vLLM's next backend.
        ``stream``: the capture stream (default: torch's current one, which
        vLLM has already set); kernels launch on it.
        """
        runtime = self.runtime
        with contextlib.ExitStack() as scope:
            if self.fallback is not None:
                scope.enter_context(self.fallback.capture())
            if runtime is not None and len(self.plans) > 0:
                if stream is not None:
                    scope.enter_context(torch.cuda.stream(stream))
                scope.enter_context(runtime.capture())
            elif runtime is not None:
                _log_once(
                    logging.INFO,
                    "b12x all-reduce: nothing declared at graph capture; captured "
                    "all-reduces run on vLLM's own backends",
                )
            yield

    def close(self) -> None:
        """Releases the runtime and the fallback and forgets every declaration; idempotent."""
        runtime, fallback = self.runtime, self.fallback
        self.fallback, self._pending = None, None
        self._use(None)
        if runtime is not None:
            runtime.close()
        if fallback is not None:
            fallback.close()

    def __del__(self) -> None:
        # As vLLM's own CustomAllreduce: dropping the adapter releases its runtime.
        # Closing is collective: at interpreter exit the peers may be gone already,
        # and the process's exit releases everything anyway. A half-built
        # adapter (its constructor raised) has nothing to release.
        if sys.is_finalizing() or not hasattr(self, "plans"):
            return
        try:
            self.close()
        except Exception as e:  # never raise from a finalizer
            logger.warning("b12x PCIe all-reduce: close at teardown failed: %s", e)
