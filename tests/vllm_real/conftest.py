"""Tests against the real vLLM 0.33.0 (``./dev setup`` installs it: requirements-vllm.txt).

vLLM runs on its CPU platform here (``VLLM_TARGET_DEVICE=cpu``), on a
developer's machine and in CI alike. Its modules are imported once up front
with warnings ignored: what vLLM and its dependencies warn about at import
is theirs, and pytest turns warnings into errors.

Fixtures: ``tp_ranks``, two real vLLM ranks forming a TP group over gloo
(:mod:`tp_harness`), spawned once per session on first use.

On a GPU host, ``VLLM_TARGET_DEVICE=cuda`` (tools/gpu/vllm_real.sh) gives vLLM
its CUDA platform instead: the ``test_gpu_*`` files run there (they skip on the
CPU platform) and every other file here skips, as it builds its tensors on the
CPU for vLLM's CPU platform.
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


def pytest_collection_modifyitems(config, items):
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return
    skip = pytest.mark.skip(
        reason="written for vLLM's CPU platform (CPU tensors); on its CUDA platform "
        f"the {GPU_FILES}* files run"
    )
    for item in items:
        path = Path(item.path).resolve()
        if path.parent == HERE and not path.name.startswith(GPU_FILES):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tp_ranks():
    from tp_harness import TpRanks

    ranks = TpRanks(world_size=2)
    yield ranks
    ranks.close()
