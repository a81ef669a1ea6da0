"""Declared-plan single-node all-reduce.

Plans are declared up front as :class:`Invocation` records and prepared once;
at serving time a :class:`DeclaredPlanIndex` either finds the plan declared
for exactly the live tensor's key or reports a miss, and the caller declines
to the next backend (NCCL). :class:`UndeclaredPlanError` is what
:meth:`DeclaredPlanIndex.plan_for` raises on a miss.

* :mod:`~b12x.comm.pcie.invocation`: the record, what declaring reads of it
  (:class:`Declaration`) and the operation names :data:`PLAIN` / :data:`FUSED`.
* :mod:`~b12x.comm.pcie.knobs`: :class:`Limits` and the environment knobs.
* :mod:`~b12x.comm.pcie.handshake`: the collective set-up and teardown.
* :mod:`~b12x.comm.pcie.declared`: :func:`route` and :class:`DeclaredPlans`
  (route, prepare, index), the declared half of every runtime.
* :mod:`~b12x.comm.pcie.allreduce`: the :class:`AllReduce` runtime (declare,
  admit once, live calls).
"""

from b12x._core import AllReduceCall, AllReducePlan
from b12x.comm.pcie.allreduce import AllReduce
from b12x.comm.pcie.declared import DeclaredPlans, route
from b12x.comm.pcie.index import DeclaredPlanIndex, plan_key
from b12x.comm.pcie.invocation import (
    ALL_REDUCE,
    ALL_REDUCE_FUSED_ADD_RMS_NORM,
    FUSED,
    PLAIN,
    Declaration,
    Invocation,
    Operation,
)
from b12x.comm.pcie.knobs import Limits
from b12x.errors import UndeclaredPlanError

__all__ = [
    "ALL_REDUCE",
    "ALL_REDUCE_FUSED_ADD_RMS_NORM",
    "FUSED",
    "PLAIN",
    "AllReduce",
    "AllReduceCall",
    "AllReducePlan",
    "Declaration",
    "DeclaredPlanIndex",
    "DeclaredPlans",
    "Invocation",
    "Limits",
    "Operation",
    "UndeclaredPlanError",
    "plan_key",
    "route",
]
