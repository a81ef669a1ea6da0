"""Declared-plan single-node all-reduce.

Plans are declared up front as :class:`Invocation` records and prepared once;
at serving time a :class:`DeclaredPlanIndex` either finds the plan declared
for exactly the live tensor's key or reports a miss, and the caller declines
to the next backend (NCCL). :class:`UndeclaredPlanError` is what
:meth:`DeclaredPlanIndex.plan_for` raises on a miss.
"""

from b12x.comm.pcie.allreduce import AllReduce
from b12x.comm.pcie.index import DeclaredPlanIndex, plan_key
from b12x.comm.pcie.invocation import (
    ALL_REDUCE,
    ALL_REDUCE_FUSED_ADD_RMS_NORM,
    Invocation,
    Operation,
)
from b12x.errors import UndeclaredPlanError

__all__ = [
    "ALL_REDUCE",
    "ALL_REDUCE_FUSED_ADD_RMS_NORM",
    "AllReduce",
    "DeclaredPlanIndex",
    "Invocation",
    "Operation",
    "UndeclaredPlanError",
    "plan_key",
]
