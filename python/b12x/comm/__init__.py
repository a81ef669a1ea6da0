"""Single-node collectives.

* :mod:`b12x.comm.pcie`: all-reduce over CUDA IPC with declared plans: the
  :class:`~b12x.comm.pcie.Invocation` record, the
  :class:`~b12x.comm.pcie.DeclaredPlanIndex` that finds a declared plan in
  constant time, and the runtime.
"""
