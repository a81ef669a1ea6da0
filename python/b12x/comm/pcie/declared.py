"""Declaring: the one path from declared invocations to indexed plans.

:class:`DeclaredPlans` routes and prepares invocations (b12x-core) for a
group of ``world`` ranks and swaps the routed ones into its
:class:`~b12x.comm.pcie.DeclaredPlanIndex` as one snapshot (declined
invocations are logged at debug level). The runtime holds one
(:attr:`AllReduce.plans <b12x.comm.pcie.AllReduce.plans>`, whose index its
admission looks calls up in), and so does the vLLM adapter where
there is no runtime (CPU only, no process group): routing under the same
limits answers ``has_plan_for``, and nothing runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from b12x import _core
from b12x._core import AllReducePlan, DeclaredPlanIndex
from b12x.comm.pcie.knobs import Limits
from b12x.errors import ConfigError

if TYPE_CHECKING:
    from b12x.comm.pcie.invocation import Declaration

__all__ = ["DeclaredPlans", "route"]

log = logging.getLogger("b12x.comm.pcie")

#: ``route(operation, shape, dtype, strides, world, limits)``: ``(route, "")``
#: with route "oneshot", "oneshot_fused" or "twoshot", or ``(None, why)``
#: when a declaration of that kind declines to NCCL (spec §5.2; b12x-core).
route = _core.allreduce_route


class DeclaredPlans:
    """The declarations of a group of ``world`` ranks under ``limits``.

    ``multiprocessors`` sizes the plans' grids (routing does not depend on
    it) and ``twoshot_push`` picks their two-shot transport. Lookups are the
    index's own methods: ``has_plan_for(tensor, operation=None, weight=None,
    epsilon=None)`` (True when a routed declaration has this call's exact
    key; never raises) and ``plan_for(...)`` (its plan, or
    :class:`~b12x.errors.UndeclaredPlanError`).
    """

    def __init__(
        self,
        world: int,
        limits: Limits,
        *,
        multiprocessors: int = 1,
        twoshot_push: bool = False,
    ) -> None:
        if not isinstance(limits, Limits):
            raise ConfigError(
                "DeclaredPlans: limits expected a b12x.comm.pcie.Limits, "
                f"got {type(limits).__name__}"
            )
        self.world_size = world
        self.limits = limits
        self.multiprocessors = multiprocessors
        self.twoshot_push = twoshot_push
        self.index = DeclaredPlanIndex()
        # the index's own methods: a lookup costs one native call
        self.has_plan_for = self.index.has_plan_for
        self.plan_for = self.index.plan_for

    def declare(self, invocations: Iterable[Declaration]) -> list[tuple[Declaration, str]]:
        """Routes and prepares ``invocations`` (equal declarations share one
        plan) and replaces every earlier declaration with the routed ones in
        one step, so a concurrent lookup sees the old declarations or the new
        ones. Returns the declined ``(invocation, why)``."""
        routed, declined = _core.allreduce_prepare(
            invocations, self.world_size, self.limits, self.multiprocessors, self.twoshot_push
        )
        self.index.rebuild(routed)
        for inv, why in declined:
            log.debug("b12x IPC all-reduce declines %s: %s", getattr(inv, "name", inv), why)
        return declined

    def clear(self) -> None:
        """Forgets every declaration."""
        self.index.clear()

    @property
    def declared_plans(self) -> list[tuple[Declaration, AllReducePlan]]:
        """(invocation, plan) of every routed declaration, in declaration order."""
        pairs: list[tuple[Declaration, AllReducePlan]] = self.index.declared()
        return pairs

    def routes(self) -> dict[str, str]:
        """The route of every routed declaration, by name."""
        return {inv.name: plan.route for inv, plan in self.declared_plans}

    def __len__(self) -> int:
        """Distinct declared keys."""
        return len(self.index)
