"""Device helpers: driver facts, kernel loading, torch's current stream.

Kernels load per device when a plan or prepared op is made
(:func:`load_kernels`), never inside a hot call or a CUDA graph capture.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from b12x import _core

if TYPE_CHECKING:
    import torch

__all__ = ["current_stream", "device_index", "is_available", "load_kernels"]


def is_available() -> bool:
    """True when a CUDA driver is present and reports at least one device."""
    if not _core.driver_present():
        return False
    try:
        return _core.device_count() > 0
    except Exception:
        return False


def device_index(device: torch.device | str | int | None, *, op: str = "b12x") -> int:
    """The CUDA ordinal of ``device`` under b12x's one device grammar (the
    same for every entry point; ``_core.resolve_device``): a torch.device,
    ``"cuda:N"`` or an ordinal N in 0..=``_core.MAX_CUDA_ORDINAL``; None or a
    bare ``"cuda"`` mean the current CUDA device (torch's, cuda:0 without
    CUDA). Strings are b12x-core's device names (no surrounding whitespace);
    anything else, or the CPU, is a :class:`b12x.errors.DeviceError` naming
    ``op``.
    """
    _, index = _core.resolve_device(device, op, "cuda")
    assert index is not None  # "cuda" refuses the CPU
    return index


def load_kernels(device: torch.device | str | int | None) -> None:
    """Loads b12x's PTX on ``device`` (driver JIT on first use; seconds at most)."""
    _core.load_kernels(device_index(device))


def current_stream(device_index: int) -> int:
    """torch's current CUstream on ``device_index`` as an int (0 = legacy default)."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device_index)
