"""b12x in vLLM's custom all-reduce slot (``CudaCommunicator.ca_comm``).

vLLM's ``CudaCommunicator`` builds its custom all-reduce as
``CustomAllreduce(group=cpu_group, device=..., symm_mem_enabled=...,
register_graph_buffers=...)``, looked up in
``vllm.distributed.device_communicators.custom_all_reduce`` when each TP
communicator is made. :func:`install` puts :class:`B12xCustomAllreduce` under
that name. Built from the same call, it is b12x's
:class:`~b12x.integration.vllm.PcieAllReduce` with declarations derived from
the vLLM config (:mod:`.declarations`) and vLLM's own ``CustomAllreduce``,
built from exactly the call vLLM made, behind it.

Every all-reduce b12x has a declared plan for runs on b12x; every other one
goes to vLLM's own custom all-reduce, then to the rest of vLLM's chain
(NCCL), exactly as without b12x. All-gather and reduce-scatter are vLLM's.
On a multi-node group, a failed set-up or an unsupported GPU, b12x declines
(logged once) and the slot behaves as vLLM's own. Dropping the slot (vLLM's
``CudaCommunicator.destroy``) closes both.
"""

from __future__ import annotations

import importlib
import logging
import sys
import weakref
from collections.abc import Callable
from typing import Any

import torch

from b12x.comm.pcie import Limits
from b12x.integration.vllm import _hooks, patches
from b12x.integration.vllm.allreduce import PcieAllReduce, _log_once
from b12x.integration.vllm.declarations import AutoDeclarations, ServingShapes

__all__ = [
    "VLLM_READS",
    "B12xCustomAllreduce",
    "install",
    "installed",
    "live_slots",
    "uninstall",
]

logger = logging.getLogger(__name__)

_SLOT_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
_live: weakref.WeakSet[B12xCustomAllreduce] = weakref.WeakSet()


class B12xCustomAllreduce(PcieAllReduce):
    """vLLM's custom all-reduce slot: b12x's :class:`PcieAllReduce` with
    declarations derived from the vLLM config, and vLLM's own
    ``CustomAllreduce`` behind it (its ``fallback``).

    Takes what vLLM and the voipmonitor fork pass their custom all-reduce:
    ``group`` (the TP group's CPU group) and ``device``, positionally or by
    name, then their own options (``device_group``, ``max_size``,
    ``symm_mem_enabled``, ``register_graph_buffers``, ...), handed on to
    vLLM's own class where it takes them. Collective: every rank of the group
    builds it, as vLLM does. Of vLLM's own object it answers exactly what
    vLLM reads (:data:`VLLM_READS`); nothing else is forwarded.

    ``runtime_factory`` (class attribute): ``(group, device, limits) ->
    runtime`` used instead of building b12x's IPC runtime; the seam tests use
    to stand in for the two-GPU runtime.
    """

    runtime_factory: Callable[[Any, Any, Any], Any] | None = None

    def __init__(self, group: Any, device: Any, *args: Any, **kwargs: Any) -> None:
        self._auto: AutoDeclarations | None = None
        stock = _stock_class()(group, device, *args, **_stock_options(kwargs))
        world = group.size()
        name = f"b12x all-reduce for a TP group of {world}"
        factory = type(self).runtime_factory
        if world < 2:
            super().__init__(device=device, world_size=world, limits=Limits(), fallback=stock)
        elif not _hooks.same_node(group):  # collective: every rank gets the same answer
            _log_once(logging.WARNING, "%s declined: the group spans nodes", name)
            super().__init__(device=device, world_size=world, limits=Limits(), fallback=stock)
        elif factory is None:
            super().__init__(group, device, fallback=stock)
        else:
            runtime = None
            try:
                runtime = factory(group, device, None)
            except Exception as e:  # a factory agrees its verdict over the group, as the runtime
                _log_once(logging.WARNING, "%s declined: set-up failed: %s", name, e)
            limits = Limits() if runtime is None else None
            super().__init__(
                device=device, world_size=world, runtime=runtime, limits=limits, fallback=stock
            )
        if self.runtime is not None:
            self._declare_from_config(name)
        _live.add(self)

    @classmethod
    def from_parts(cls, stock: Any, runtime: Any) -> B12xCustomAllreduce:
        """A slot over an already-built vLLM custom all-reduce ``stock`` and b12x
        runtime, declaring nothing (nothing collective happens; ``b12x bench host``)."""
        self = cls.__new__(cls)
        self._auto = None
        PcieAllReduce.__init__(
            self, device=runtime.device, world_size=runtime.world_size, runtime=runtime,
            fallback=stock,
        )  # fmt: skip
        _live.add(self)
        return self

    def _declare_from_config(self, name: str) -> None:
        """Declares what the vLLM config says the TP all-reduces are (logged once)."""
        shapes = ServingShapes.from_vllm_config(_hooks.vllm_config())
        if shapes is None:
            _log_once(logging.WARNING, "%s: no vLLM model config, nothing declared", name)
            return
        self._auto = AutoDeclarations(shapes, self.limits)
        self.register_describer(self._auto, self._auto.describe)
        routes = self.prepare()
        _log_once(
            logging.INFO,
            "%s: %d token counts of hidden size %d (%s) declared; other shapes run on "
            "vLLM's own backends",
            name,
            len(routes),
            shapes.hidden_size,
            str(shapes.dtype).removeprefix("torch."),
        )
        if _hooks.flashinfer_all_reduce_first():
            _log_once(
                logging.INFO,
                "%s: vLLM's FlashInfer all-reduce runs before its custom all-reduce slot and "
                "keeps the shapes it takes; VLLM_ALLREDUCE_USE_FLASHINFER=0 gives them to b12x",
                name,
            )

    # --- the fused all-reduce + add + RMSNorm --------------------------------------------

    def supports_fused_add_rms_norm(self) -> bool:
        """Whether fused calls can be offered (each is still admitted by its plan)."""
        return self._auto is not None and super().supports_fused_add_rms_norm()

    def try_fused_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        epsilon: float,
        out: torch.Tensor | None = None,
    ) -> bool:
        """The fused op on b12x if it takes it, else False (nothing touched).

        A weight seen for the first time is recorded, and declared with the
        others recorded so far at the first call the fused route could take
        (every rank sees the same weights and shapes in the same order,
        so every rank declares alike).
        """
        auto = self._auto
        if auto is None or not self.supports_fused_add_rms_norm():
            return False
        found = auto.norm(weight, epsilon)
        if found is None or inp.shape[0] > found[1]:
            return False
        if auto.pending:
            self.prepare()
            auto.pending = False
        return super().try_fused_add_rms_norm(inp, residual, found[0], epsilon, out)


#: What vLLM 0.33 reads of its custom all-reduce slot (``CudaCommunicator``,
#: ``GroupCoordinator.graph_capture``, model code); the slot answers exactly these.
VLLM_READS = (
    "disabled",
    "should_custom_ar",
    "custom_all_reduce",
    "custom_all_gather",
    "custom_reduce_scatter",
    "capture",
    "close",
    "fully_connected",
    "mnnvl_lamport_ag_multicast_ptr",
)


def _stock_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` that vLLM's own ``CustomAllreduce`` takes (the fork passes
    ``device_group=``, which vLLM's class has no parameter for)."""
    import inspect

    accepted = inspect.signature(_stock_class()).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return options
    return {k: v for k, v in options.items() if k in accepted}


def _stock_class() -> type:
    """vLLM's own ``CustomAllreduce`` (kept by the patch table while b12x's is in)."""
    try:
        stock: type = patches.original(_SLOT_MODULE, "CustomAllreduce")
    except KeyError:
        stock = importlib.import_module(_SLOT_MODULE).CustomAllreduce
    return stock


def install() -> bool:
    """Puts :class:`B12xCustomAllreduce` in vLLM's custom all-reduce slot; idempotent.

    Affects the TP communicators vLLM builds from now on. Returns True.
    """
    if not installed():
        patches.install("allreduce")
        logger.info("b12x all-reduce installed in vLLM's custom all-reduce slot")
    return True


def uninstall() -> None:
    """Puts vLLM's own ``CustomAllreduce`` back (communicators already built keep theirs)."""
    patches.uninstall("allreduce")


def installed() -> bool:
    """Whether vLLM builds :class:`B12xCustomAllreduce` in this process (False before vLLM)."""
    module = sys.modules.get(_SLOT_MODULE)
    return module is not None and module.CustomAllreduce is B12xCustomAllreduce


def live_slots() -> list[B12xCustomAllreduce]:
    """The slots alive in this process (for ``b12x doctor`` and tests)."""
    return list(_live)
