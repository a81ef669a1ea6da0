"""Collectives: :mod:`b12x.comm.pcie` (single-node CUDA-IPC all-reduce)."""
