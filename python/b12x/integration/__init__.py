"""Adapters that put b12x where serving stacks already call their kernels.

* :mod:`b12x.integration.vllm`: the C4 sparse indexer and the PCIe all-reduce
  adapters for vLLM. Importing them never imports vLLM.
"""
