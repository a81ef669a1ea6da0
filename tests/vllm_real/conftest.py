"""Tests against the real vLLM 0.33.0 (``./dev setup`` installs it: requirements-vllm.txt).

vLLM runs on its CPU platform here (``VLLM_TARGET_DEVICE=cpu``), on a
developer's machine and in CI alike. Its modules are imported once up front
with warnings ignored: what vLLM and its dependencies warn about at import
is theirs, and pytest turns warnings into errors.

Fixtures: ``tp_ranks``, two real vLLM ranks forming a TP group over gloo
(:mod:`tp_harness`), spawned once per session on first use.
"""

from __future__ import annotations

import os
import warnings

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import vllm.config
    import vllm.distributed.parallel_state
    import vllm.plugins  # noqa: F401


@pytest.fixture(scope="session")
def tp_ranks():
    from tp_harness import TpRanks

    ranks = TpRanks(world_size=2)
    yield ranks
    ranks.close()
