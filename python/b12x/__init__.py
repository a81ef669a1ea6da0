"""b12x: the serving hot path of sparse-attention LLMs, without the host overhead.

* :mod:`b12x.attention.dsa_indexer`: the planned C4 sparse indexer.
* :mod:`b12x.comm.pcie`: declared-plan single-node all-reduce.
* :mod:`b12x.integration.vllm`: adapters for vLLM.

Importing b12x never needs a GPU or a driver; :func:`b12x.cuda.is_available`
says whether kernels can run here.
"""

from b12x import errors
from b12x._core import __version__, build_info
from b12x.errors import (
    AlignmentError,
    B12xError,
    CapacityError,
    CollectiveTimeoutError,
    ConfigError,
    CudaError,
    DeviceError,
    DTypeError,
    KernelLoadError,
    LayoutError,
    NotATensorError,
    PageTableError,
    ShapeError,
    UndeclaredPlanError,
    UnsupportedTensorError,
)

__all__ = [
    "AlignmentError",
    "B12xError",
    "CapacityError",
    "CollectiveTimeoutError",
    "ConfigError",
    "CudaError",
    "DTypeError",
    "DeviceError",
    "KernelLoadError",
    "LayoutError",
    "NotATensorError",
    "PageTableError",
    "ShapeError",
    "UndeclaredPlanError",
    "UnsupportedTensorError",
    "__version__",
    "build_info",
    "errors",
]
