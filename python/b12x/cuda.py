"""Device helpers: driver facts, kernel loading, torch's current stream.

Kernels load per device when a plan or prepared op is made
(:func:`load_kernels`), never inside a hot call or a CUDA graph capture.
"""

from __future__ import annotations

from typing import Any

from b12x import _core

__all__ = ["current_stream", "device_index", "is_available", "load_kernels"]


def is_available() -> bool:
    """True when a CUDA driver is present and reports at least one device."""
    if not _core.driver_present():
        return False
    try:
        return _core.device_count() > 0
    except Exception:
        return False


def device_index(device: Any) -> int:
    """The CUDA ordinal of a torch device, a ``"cuda[:N]"`` string or an int.

    A bare ``"cuda"`` means torch's current device.
    """
    import torch

    if isinstance(device, int):
        return device
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device expected a CUDA device, got {dev}")
    return dev.index if dev.index is not None else torch.cuda.current_device()


def load_kernels(device: Any) -> None:
    """Loads b12x's PTX on ``device`` (driver JIT on first use; seconds at most)."""
    _core.load_kernels(device_index(device))


def current_stream(device_index: int) -> int:
    """torch's current CUstream on ``device_index`` as an int (0 = legacy default)."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device_index)
