"""Tests against the real vLLM 0.33.0 (``./dev setup`` installs it: requirements-vllm.txt).

vLLM runs on its CPU platform here (``VLLM_TARGET_DEVICE=cpu``), on a
developer's machine and in CI alike. Its modules are imported once up front
with warnings ignored: what vLLM and its dependencies warn about at import
is theirs, and pytest turns warnings into errors.

Fixtures: ``tp_ranks``, two real vLLM ranks forming a TP group over gloo
(:mod:`tp_harness`), spawned once per session on first use.

On a GPU host, ``VLLM_TARGET_DEVICE=cuda`` (tools/gpu/vllm_real.sh) gives vLLM
its CUDA platform instead: the ``test_gpu_*`` files run there (they skip on the
CPU platform) and every other file here is left out of the collection (named in
the report header), as it builds its tensors on the CPU for vLLM's CPU platform.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import vllm.config
    import vllm.distributed.parallel_state
    import vllm.plugins  # noqa: F401


HERE = Path(__file__).resolve().parent
GPU_FILES = "test_gpu_"


def _on_cuda_platform() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda())


def _cpu_platform_file(path: Path) -> bool:
    """A test file of this folder that runs on vLLM's CPU platform only."""
    return (
        path.parent == HERE
        and path.name.startswith("test_")
        and path.suffix == ".py"
        and not path.name.startswith(GPU_FILES)
    )


def pytest_ignore_collect(collection_path, config):
    """On vLLM's CUDA platform the CPU-platform files are not even imported:
    they build CPU tensors, and their imports may need what the GPU host lacks."""
    if _cpu_platform_file(Path(collection_path).resolve()) and _on_cuda_platform():
        return True
    return None


def pytest_report_header(config):
    if _on_cuda_platform():
        left = sorted(p.name for p in HERE.glob("test_*.py") if _cpu_platform_file(p))
        return [f"vLLM's CUDA platform: the {GPU_FILES}* files run; {len(left)} CPU-platform "
                f"files left out ({', '.join(left)})"]  # fmt: skip
    return None


@pytest.fixture(scope="session")
def tp_ranks():
    from tp_harness import TpRanks

    ranks = TpRanks(world_size=2)
    yield ranks
    ranks.close()
