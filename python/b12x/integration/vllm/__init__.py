"""vLLM adapters: the C4 sparse indexer and the PCIe all-reduce.

Importing this package never imports vLLM; the adapters look vLLM's services
up lazily (:mod:`b12x.integration.vllm._hooks`) when a model calls them.

* :class:`C4SparseIndexer` (alias :data:`DeepseekV4B12xSparseIndexer`): plan
  reuse through the library's plan cache, fresh workspace views per call,
  profile-workspace reservation, per-request prefill chunks, device-side
  active width.
* :class:`PcieAllReduce`: describers whose declarations go to the runtime's
  declared plans, one-call admission, fused all-reduce + add + RMSNorm,
  CUDA-graph capture.

Inside a real vLLM: :mod:`.plugin` (the ``vllm.general_plugins`` entry point
and its switch ``B12X_VLLM``), :mod:`.communicator` (b12x in vLLM's custom
all-reduce slot, declarations from the vLLM config: :mod:`.declarations`) and
:mod:`.fused_op` (``torch.ops.b12x.fused_all_reduce_add_rms_norm``).
"""

from b12x.integration.vllm.allreduce import (
    PcieAllReduce,
    add_rms_norm_,
    register_collective_describer,
)
from b12x.integration.vllm.indexer import (
    C4SparseIndexer,
    DeepseekV4B12xSparseIndexer,
    b12x_indexer_is_supported,
)

__all__ = [
    "C4SparseIndexer",
    "DeepseekV4B12xSparseIndexer",
    "PcieAllReduce",
    "add_rms_norm_",
    "b12x_indexer_is_supported",
    "register_collective_describer",
]
