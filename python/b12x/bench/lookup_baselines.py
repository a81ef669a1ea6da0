"""Pure-Python ports of the two reference lookups that ``b12x bench lookup`` compares against.

Both reproduce the vLLM B12X PCIe all-reduce adapter as spec
``reference-collectives.md`` describes it, faithfully enough that their cost
per call is the reference's cost per call:

* :class:`ScanCommunicator` -- the predecessor (A0, spec §4.4): ``_plan_for``
  builds ``tuple(inp.stride())``, then walks every declaration in order,
  comparing operation, shape, dtype, strides (recomputing contiguous strides
  for each entry reached) and, for the fused operation, weight identity and
  epsilon, short-circuiting left to right. On a miss it imports the error
  class, joins an O(N) "declared:" list into the message and raises;
  ``_has_plan_for`` imports the error class too, calls ``_plan_for`` in a
  ``try``, and on the exception logs a debug line and returns False.
* :class:`DictCommunicator` -- the dict index (A2, spec §4.1-4.3): the key
  ``(operation, tuple(shape), dtype, address strides, norm)`` with the
  stride of every size-1 dimension set to 0, built at index time with
  ``setdefault`` (first declaration wins) and looked up with one
  ``dict.get``; a miss logs the same debug line.

Logging stays at its default level, so the debug calls cost a level check,
as in the reference benchmark. Both classes are set up the way the
reference benchmark does it: no ``__init__``; ``_invocations`` (name ->
invocation) and ``_plans`` (name -> plan) are assigned, then
``_index_declared_plans()`` is called where the class has it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)


class ScanError(RuntimeError):
    """What the scan raises on a miss (the reference raised its own RuntimeError subclass)."""


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    stride = 1
    for size in reversed(shape):
        strides.append(stride)
        stride *= size
    return tuple(reversed(strides))


class ScanCommunicator:
    """The linear scan of A0 (spec §4.4): O(N) per call, an exception per miss."""

    _invocations: dict[str, Any]
    _plans: dict[str, Any]

    def _plan_for(
        self,
        inp: torch.Tensor,
        operation: str = "all_reduce",
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> Any:
        strides = tuple(inp.stride())
        for name, inv in self._invocations.items():
            if (
                inv.operation == operation
                and tuple(inp.shape) == inv.shape
                and inp.dtype == inv.dtype
                and strides == (inv.strides or _contiguous_strides(inv.shape))
                and (
                    operation == "all_reduce"
                    or (inv.norm_weight is weight and inv.epsilon == epsilon)
                )
            ):
                return self._plans[name]
        from b12x.bench.lookup_baselines import ScanError

        declared = ", ".join(f"{inv.operation}{inv.shape}" for inv in self._invocations.values())
        raise ScanError(
            f"PCIe collective has no declared plan for {operation} on shape "
            f"{tuple(inp.shape)} {inp.dtype} strides {strides}; declared: {declared}"
        )

    def _has_plan_for(self, inp: torch.Tensor, **kwargs: Any) -> bool:
        from b12x.bench.lookup_baselines import ScanError

        try:
            self._plan_for(inp, **kwargs)
        except ScanError:
            logger.debug(
                "b12x PCIe all-reduce declines undeclared shape %s %s",
                tuple(inp.shape),
                inp.dtype,
            )
            return False
        return True


def _plan_key(
    operation: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    strides: Sequence[int],
    weight: torch.Tensor | None = None,
    epsilon: float | None = None,
) -> tuple[Any, ...]:
    shape = tuple(shape)
    address_strides = tuple(
        0 if size == 1 else stride for size, stride in zip(shape, strides, strict=False)
    )
    norm = None if operation == "all_reduce" else (id(weight), epsilon)
    return (operation, shape, dtype, address_strides, norm)


class DictCommunicator:
    """The dict index of A2 (spec §4.1-4.3): one key build and one ``dict.get`` per call."""

    _invocations: dict[str, Any]
    _plans: dict[str, Any]
    _plan_index: dict[tuple[Any, ...], Any]

    def _index_declared_plans(self) -> None:
        index: dict[tuple[Any, ...], Any] = {}
        for name, inv in self._invocations.items():
            strides = inv.strides or _contiguous_strides(inv.shape)
            key = _plan_key(
                inv.operation, inv.shape, inv.dtype, strides, inv.norm_weight, inv.epsilon
            )
            index.setdefault(key, self._plans[name])
        self._plan_index = index

    def _lookup_plan(
        self,
        inp: torch.Tensor,
        operation: str = "all_reduce",
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> Any:
        return self._plan_index.get(
            _plan_key(operation, inp.shape, inp.dtype, inp.stride(), weight, epsilon)
        )

    def _has_plan_for(self, inp: torch.Tensor, **kwargs: Any) -> bool:
        if self._lookup_plan(inp, **kwargs) is not None:
            return True
        logger.debug(
            "b12x PCIe all-reduce declines undeclared shape %s %s", tuple(inp.shape), inp.dtype
        )
        return False
