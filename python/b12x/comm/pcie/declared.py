"""Declaring: the one path from declared invocations to indexed plans.

:func:`declare_plans` routes and prepares invocations (b12x-core) and swaps
the routed ones into a :class:`~b12x.comm.pcie.DeclaredPlanIndex` as one
snapshot. :meth:`AllReduce.declare <b12x.comm.pcie.AllReduce.declare>`
declares through it, and so does :class:`DeclaredPlans`, the declared half
of a runtime for where there is none (CPU only, no process group): routing
under the same limits answers ``has_plan_for``, and nothing runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from b12x import _core
from b12x._core import AllReducePlan, DeclaredPlanIndex
from b12x.comm.pcie.invocation import PLAIN
from b12x.comm.pcie.knobs import Limits
from b12x.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from b12x.comm.pcie.allreduce import Declaration

__all__ = ["DeclaredPlans", "declare_plans"]


def declare_plans(
    index: DeclaredPlanIndex,
    invocations: Iterable[Declaration],
    world: int,
    limits: Limits,
    multiprocessors: int,
    twoshot_push: bool = False,
) -> tuple[list[tuple[Declaration, AllReducePlan]], list[tuple[Declaration, str]]]:
    """Routes and prepares ``invocations`` for ``world`` ranks and replaces
    ``index``'s declarations with the routed ones in one step.

    Returns ``(routed, declined)`` as
    :func:`~b12x.comm.pcie.allreduce.prepare_declarations` does: routed is
    ``[(invocation, plan)]`` in declaration order (equal declarations share a
    plan), declined is ``[(invocation, why)]``.
    """
    routed, declined = _core.allreduce_prepare(
        invocations, world, limits, multiprocessors, twoshot_push
    )
    index.rebuild(routed)
    return routed, declined


class DeclaredPlans:
    """The declarations of a group of ``world`` ranks under ``limits``, without a runtime.

    It answers to the declared half of :class:`~b12x.comm.pcie.AllReduce`
    under the same names (``declare``, ``declared_plans``, ``index``,
    ``has_plan_for``, ``plan_for``, ``admit``), so a caller treats both alike;
    ``admit`` always declines, as nothing runs here. ``multiprocessors`` sizes
    the plans' grids (there is no device to ask; routing does not depend on
    it) and ``twoshot_push`` picks their two-shot transport.
    """

    def __init__(
        self,
        world: int,
        limits: Limits,
        *,
        multiprocessors: int = 1,
        twoshot_push: bool = False,
    ) -> None:
        self.world_size = world
        self.limits = limits
        self.multiprocessors = multiprocessors
        self.twoshot_push = twoshot_push
        self.index = DeclaredPlanIndex()

    def declare(self, invocations: Iterable[Declaration]) -> list[tuple[Declaration, str]]:
        """Routes and prepares ``invocations``; replaces earlier declarations.
        Returns the declined ``(invocation, why)``."""
        if not isinstance(self.limits, Limits):
            raise ConfigError(
                "DeclaredPlans.declare: limits expected a b12x.comm.pcie.Limits, "
                f"got {type(self.limits).__name__}"
            )
        _, declined = declare_plans(
            self.index,
            invocations,
            self.world_size,
            self.limits,
            self.multiprocessors,
            self.twoshot_push,
        )
        return declined

    def clear(self) -> None:
        """Forgets every declaration."""
        self.index.clear()

    @property
    def declared_plans(self) -> list[tuple[Declaration, AllReducePlan]]:
        """(invocation, plan) of every routed declaration, in declaration order."""
        pairs: list[tuple[Declaration, AllReducePlan]] = self.index.declared()
        return pairs

    def has_plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> bool:
        """True when a routed declaration has this call's exact key; never raises."""
        return self.index.has_plan_for(inp, operation, weight, epsilon)

    def plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> AllReducePlan:
        """The declared plan of this call; raises UndeclaredPlanError if none."""
        plan: AllReducePlan = self.index.plan_for(inp, operation, weight, epsilon)
        return plan

    def admit(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> AllReducePlan | None:
        """None: without a runtime no call runs here."""
        return None

    def __len__(self) -> int:
        """Distinct declared keys."""
        return len(self.index)
