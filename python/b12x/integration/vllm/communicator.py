"""b12x in vLLM's custom all-reduce slot (``CudaCommunicator.ca_comm``).

vLLM's ``CudaCommunicator`` builds its custom all-reduce as
``CustomAllreduce(group=cpu_group, device=..., symm_mem_enabled=...,
register_graph_buffers=...)``, looked up in
``vllm.distributed.device_communicators.custom_all_reduce`` when each TP
communicator is made. :func:`install` puts :class:`B12xCustomAllreduce` under
that name. Built from the same call, it holds:

* vLLM's own ``CustomAllreduce``, built from exactly the call vLLM made, and
* b12x's :class:`~b12x.integration.vllm.PcieAllReduce`, with declarations
  derived from the vLLM config (:mod:`.declarations`).

Every all-reduce b12x has a declared plan for runs on b12x; every other one
goes to vLLM's own custom all-reduce, then to the rest of vLLM's chain
(NCCL), exactly as without b12x. All-gather and reduce-scatter are vLLM's.
On a multi-node group, a failed set-up or an unsupported GPU, b12x declines
(logged once) and the slot behaves as vLLM's own.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from b12x.integration.vllm import _hooks
from b12x.integration.vllm.allreduce import PcieAllReduce, _log_once
from b12x.integration.vllm.declarations import AutoDeclarations, ServingShapes

__all__ = ["B12xCustomAllreduce", "install", "installed", "live_slots", "uninstall"]

logger = logging.getLogger(__name__)

_SLOT_MODULE = "vllm.distributed.device_communicators.custom_all_reduce"
_stock: type | None = None  # vLLM's CustomAllreduce while b12x's is installed
_live: weakref.WeakSet[B12xCustomAllreduce] = weakref.WeakSet()


class B12xCustomAllreduce:
    """vLLM's ``CustomAllreduce`` with b12x's declared-plan all-reduce in front.

    Takes ``CustomAllreduce``'s arguments (``group``: the TP group's CPU
    group, ``device``, then vLLM's own options, passed on unchanged).
    Collective: every rank of the group builds it, as vLLM does.

    ``runtime_factory`` (class attribute): ``(group, device, limits) ->
    runtime`` used instead of building b12x's IPC runtime; the seam tests use
    to stand in for the two-GPU runtime.
    """

    runtime_factory: Callable[[Any, Any, Any], Any] | None = None

    def __init__(self, group: Any, device: Any, *args: Any, **kwargs: Any) -> None:
        self._closed = True  # until fully built: a failed build has nothing of ours to close
        self._admitted: tuple[torch.Tensor, Any] | None = None
        self._stock = _stock_class()(group, device, *args, **kwargs)
        self._auto: AutoDeclarations | None = None
        self.b12x = self._build_b12x(group, device)
        self.disabled = self.b12x.disabled and self._stock.disabled
        self._closed = False
        _live.add(self)

    @classmethod
    def from_parts(cls, stock: Any, b12x: PcieAllReduce) -> B12xCustomAllreduce:
        """A slot over an already-built vLLM custom all-reduce ``stock`` and
        b12x adapter (nothing collective happens; ``b12x bench host``)."""
        self = cls.__new__(cls)
        self._closed = False
        self._admitted = None
        self._stock = stock
        self._auto = None
        self.b12x = b12x
        self.disabled = b12x.disabled and stock.disabled
        _live.add(self)
        return self

    def _build_b12x(self, group: Any, device: Any) -> PcieAllReduce:
        """b12x's adapter, or a disabled one when b12x declines this group (logged once)."""
        world = group.size()
        if world < 2:
            return _declined(device, world)
        name = f"b12x all-reduce for a TP group of {world}"
        if not _hooks.same_node(group):  # collective: every rank gets the same answer
            _log_once(logging.WARNING, "%s declined: the group spans nodes", name)
            return _declined(device, world)
        factory = type(self).runtime_factory
        if factory is None:
            adapter = PcieAllReduce(group, device)
        else:
            try:
                runtime = factory(group, device, None)
            except Exception as e:  # a factory agrees its verdict over the group, as the runtime
                _log_once(logging.WARNING, "%s declined: set-up failed: %s", name, e)
                return _declined(device, world)
            adapter = PcieAllReduce(device=device, world_size=world, runtime=runtime)
        if adapter.disabled:  # the adapter logged why
            return adapter
        shapes = ServingShapes.from_vllm_config(_hooks.vllm_config())
        if shapes is None:
            _log_once(logging.WARNING, "%s: no vLLM model config, nothing declared", name)
            return adapter
        self._auto = AutoDeclarations(shapes, adapter.limits)
        adapter.register_describer(self._auto, self._auto.describe)
        routes = adapter.prepare()
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
        return adapter

    # --- what CudaCommunicator calls ----------------------------------------------------

    def should_custom_ar(self, inp: torch.Tensor) -> bool:
        """b12x's admission, else vLLM's own answer.

        vLLM calls :meth:`custom_all_reduce` on the same tensor right after a
        True, so the admission (b12x's plan, or None when vLLM's own takes it)
        is kept for that call: one lookup per all-reduce.
        """
        plan = self.b12x.admit(inp)
        if plan is None and not self._stock.should_custom_ar(inp):
            self._admitted = None
            return False
        self._admitted = (inp, plan)
        return True

    def custom_all_reduce(self, inp: torch.Tensor) -> torch.Tensor | None:
        admitted, self._admitted = self._admitted, None
        plan = admitted[1] if admitted is not None and admitted[0] is inp else self.b12x.admit(inp)
        out = None if plan is None else self.b12x.custom_all_reduce(inp, plan=plan)
        if out is not None:
            return out
        return self._stock.custom_all_reduce(inp)

    def custom_all_gather(self, inp: torch.Tensor) -> torch.Tensor | None:
        """vLLM's own custom all-gather; None (decline) where it has none."""
        return self._stock.custom_all_gather(inp)

    def custom_reduce_scatter(self, inp: torch.Tensor) -> torch.Tensor | None:
        """vLLM's own custom reduce-scatter; None (decline) where it has none."""
        return self._stock.custom_reduce_scatter(inp)

    @contextlib.contextmanager
    def capture(self, stream: Any = None) -> Iterator[None]:
        """What ``GroupCoordinator.graph_capture`` enters: vLLM's capture and b12x's."""
        with self._stock.capture(), self.b12x.capture(stream=stream):
            yield

    @property
    def fully_connected(self) -> bool:
        """vLLM's own flag (model code reads it to pick its custom all-gather)."""
        return bool(getattr(self._stock, "fully_connected", False))

    # --- the fused all-reduce + add + RMSNorm --------------------------------------------

    def supports_fused_add_rms_norm(self) -> bool:
        """Whether fused calls can be offered (each is still admitted by its plan)."""
        return self._auto is not None and self.b12x.supports_fused_add_rms_norm()

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
        others recorded so far at the first call small enough for the fused
        route (every rank sees the same weights and shapes in the same order,
        so every rank declares alike).
        """
        auto = self._auto
        if auto is None or not self.b12x.supports_fused_add_rms_norm():
            return False
        declared, _ = auto.norm(weight, epsilon)
        limits = self.b12x.limits
        if (
            declared is None
            or limits is None
            or inp.numel() * inp.element_size() > limits.fused_max
        ):
            return False
        if auto.pending:
            self.b12x.prepare()
            auto.pending = False
        return self.b12x.try_fused_add_rms_norm(inp, residual, declared, epsilon, out)

    # --- teardown ------------------------------------------------------------------------

    def close(self) -> None:
        """Closes b12x's runtime and vLLM's own custom all-reduce; idempotent."""
        if self._closed:
            return
        self._closed = True
        self.disabled = True
        self._admitted = None
        self.b12x.close()
        self._stock.close()

    def __del__(self) -> None:
        # CudaCommunicator.destroy drops ca_comm and relies on this, as for vLLM's own.
        # Closing is collective: at interpreter exit the peers may be gone already,
        # and the process's exit releases everything anyway.
        if sys.is_finalizing():
            return
        try:
            self.close()
        except Exception as e:  # never raise from a finalizer
            logger.warning("b12x all-reduce: close at teardown failed: %s", e)

    def __getattr__(self, name: str) -> Any:
        # anything else vLLM reads from its CustomAllreduce (buffers, sizes, flags)
        if name == "_stock":
            raise AttributeError(name)
        return getattr(self._stock, name)


def _declined(device: Any, world: int) -> PcieAllReduce:
    """An adapter that declines every call (no runtime; it never routes, so no limits)."""
    return PcieAllReduce(device=device, world_size=world, limits=object())


def _stock_class() -> type:
    if _stock is not None:
        return _stock
    import importlib

    return importlib.import_module(_SLOT_MODULE).CustomAllreduce


def install() -> bool:
    """Puts :class:`B12xCustomAllreduce` in vLLM's custom all-reduce slot; idempotent.

    Affects the TP communicators vLLM builds from now on. Returns True.
    """
    global _stock
    import importlib

    module: Any = importlib.import_module(_SLOT_MODULE)
    if module.CustomAllreduce is not B12xCustomAllreduce:
        _stock = module.CustomAllreduce
        module.CustomAllreduce = B12xCustomAllreduce
        logger.info("b12x all-reduce installed in vLLM's custom all-reduce slot")
    return True


def uninstall() -> None:
    """Puts vLLM's own ``CustomAllreduce`` back (communicators already built keep theirs)."""
    global _stock
    if _stock is None:
        return
    import importlib

    module: Any = importlib.import_module(_SLOT_MODULE)
    module.CustomAllreduce = _stock
    _stock = None


def installed() -> bool:
    """Whether vLLM builds :class:`B12xCustomAllreduce` in this process (False before vLLM)."""
    module = sys.modules.get(_SLOT_MODULE)
    return module is not None and module.CustomAllreduce is B12xCustomAllreduce


def live_slots() -> list[B12xCustomAllreduce]:
    """The slots alive in this process (for ``b12x doctor`` and tests)."""
    return list(_live)
