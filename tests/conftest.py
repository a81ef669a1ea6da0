"""Shared pytest fixtures and GPU gating.

GPU tests carry ``@pytest.mark.gpu`` (one CUDA GPU) or ``@pytest.mark.multi_gpu``
(two or more); they skip themselves where CUDA is missing, so CI (no GPU) runs
the CPU suite only.
"""

from __future__ import annotations

import pytest


def _cuda_devices() -> int:
    try:
        import torch
        from b12x import cuda

        if not (torch.cuda.is_available() and cuda.is_available()):
            return 0
        return torch.cuda.device_count()
    except Exception:
        return 0


def pytest_collection_modifyitems(config, items):
    count = _cuda_devices()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    skip_multi = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if "multi_gpu" in item.keywords and count < 2:
            item.add_marker(skip_multi)
        elif "gpu" in item.keywords and count < 1:
            item.add_marker(skip_gpu)
