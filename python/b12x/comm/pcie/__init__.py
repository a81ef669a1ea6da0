"""Single-node all-reduce over CUDA IPC with a declared-plan index."""

from b12x.comm.pcie.allreduce import AllReduce as AllReduce
