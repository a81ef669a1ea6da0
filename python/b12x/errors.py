"""The b12x exception hierarchy.

Every exception b12x raises on purpose derives from :class:`B12xError` and
from the builtin that fits, so callers can catch either::

    try:
        binding = dsa_indexer.bind(plan, ...)
    except ValueError as e:  # or b12x.errors.ShapeError, or B12xError
        ...

Messages read ``"{op}: {operand} expected {expected}, got {actual}"``.
"""

from __future__ import annotations

__all__ = [
    "AlignmentError",
    "ArgumentTypeError",
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
]


class B12xError(Exception):
    """Base class of every error b12x raises on purpose."""


class DTypeError(B12xError, TypeError):
    """An operand has the wrong element type."""


class NotATensorError(B12xError, TypeError):
    """An operand is not a tensor (neither torch.Tensor nor a ``__dlpack__`` producer)."""


class ArgumentTypeError(B12xError, TypeError):
    """An argument has the wrong Python type (an operation given as a number,
    an epsilon as text, a pair as a list, a number where an iterable goes)."""


class UnsupportedTensorError(B12xError, TypeError):
    """A tensor that cannot be this operand at all (zero-size, negative strides)."""


class DeviceError(B12xError, ValueError):
    """An operand lives on the wrong device."""


class ShapeError(B12xError, ValueError):
    """An operand has the wrong rank or shape, or a value is out of range."""


class PageTableError(B12xError, ValueError):
    """A page table named a page past the end of the K cache (found after a run).

    The kernels skip such a page as unmapped and record the first one; raised
    by ``Binding.check()`` / ``dsa_indexer.check()``, naming the row, the
    column and the id.
    """


class LayoutError(B12xError, ValueError):
    """An operand's strides are not the required layout (e.g. not contiguous)."""


class AlignmentError(B12xError, ValueError):
    """An operand's address is not aligned as the kernel requires."""


class CapacityError(B12xError, ValueError):
    """A live size exceeds what the plan was made for, or a byte extent overflows."""


class ConfigError(B12xError, ValueError):
    """A plan, caps or declaration parameter is outside what b12x supports."""


class CudaError(B12xError, RuntimeError):
    """A CUDA driver call failed."""


class KernelLoadError(CudaError):
    """The embedded PTX could not be loaded on a device (driver too old, wrong arch)."""


class UndeclaredPlanError(B12xError, RuntimeError):
    """A collective was called directly on a shape/dtype/stride that was never declared."""


class CollectiveTimeoutError(B12xError, RuntimeError):
    """A cross-GPU wait exceeded its bound: a peer is dead or far behind."""
