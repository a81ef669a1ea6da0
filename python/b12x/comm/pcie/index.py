"""The declared-plan index (implemented in Rust: ``b12x._core.DeclaredPlanIndex``).

:class:`DeclaredPlanIndex` is the extension class itself, not a wrapper, so a
call from Python pays for one native method call and nothing else (see
``b12x bench lookup``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from b12x._core import DeclaredPlanIndex, invocation_key

if TYPE_CHECKING:
    from b12x.comm.pcie.invocation import Declaration

__all__ = ["DeclaredPlanIndex", "plan_key"]

PlanKey = tuple[str, tuple[int, ...], str, tuple[int, ...], tuple[int, float] | None]


def plan_key(invocation: Declaration) -> PlanKey:
    """The key ``invocation`` is indexed by, as plain Python values.

    ``(operation, shape, dtype name, address strides, norm)``, where address
    strides set the stride of every size-1 dimension to 0 and ``norm`` is
    ``None`` for the plain operation or ``(id(norm_weight), epsilon)`` for the
    fused one. Validates the invocation like :class:`Invocation` does.
    """
    return invocation_key(invocation)
