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
    """The CUDA ordinal of ``device``: a torch.device, ``"cuda[:N]"`` or an
    ordinal N; None or a bare ``"cuda"`` mean torch's current device (0
    without CUDA). The one device grammar of b12x's Python entry points
    (strings through ``_core.parse_device_name``); anything else, or an
    ordinal outside 0..=``_core.MAX_CUDA_ORDINAL``, is a
    :class:`b12x.errors.DeviceError` naming ``op``.
    """
    import torch

    from b12x.errors import DeviceError

    index: int | None = -1  # -1: not a CUDA device
    if device is None:
        index = None
    elif isinstance(device, int) and not isinstance(device, bool):
        index = device
    elif isinstance(device, str):
        name = _core.parse_device_name(device.strip())
        if name is not None and name[0] == "cuda":
            index = name[1]
    elif isinstance(device, torch.device) and device.type == "cuda":
        index = device.index
    if index is not None and not 0 <= index <= _core.MAX_CUDA_ORDINAL:
        raise DeviceError(
            f"{op}: device expected a CUDA device (a torch.device, 'cuda', 'cuda:N' or "
            f"an ordinal N in 0..={_core.MAX_CUDA_ORDINAL}), got {device!r}"
        )
    if index is None:
        index = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return index


def load_kernels(device: torch.device | str | int | None) -> None:
    """Loads b12x's PTX on ``device`` (driver JIT on first use; seconds at most)."""
    _core.load_kernels(device_index(device))


def current_stream(device_index: int) -> int:
    """torch's current CUstream on ``device_index`` as an int (0 = legacy default)."""
    import torch

    return torch._C._cuda_getCurrentRawStream(device_index)
