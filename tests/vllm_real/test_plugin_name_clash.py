"""Item 7 of issue 12: vLLM's detection of the public ``b12x`` (``vllm[b12x]``).

The public b12x (GEMM, MoE, attention for SM120) and this one share the
import name, and vLLM detects the former with ``find_spec("b12x")`` in
``vllm/utils/b12x.py``. None of its submodules exists here, so every getter
must come back None and every caller decline; ``has_b12x()`` must say so too
once vLLM has loaded b12x's plugin (whatever the switch says).
"""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
import vllm.plugins
import vllm.utils.b12x as detection
from vllm.platforms.interface import DeviceCapability

GETTERS = [name for name in dir(detection) if name.startswith("get_b12x_")]


def test_vllm_probes_submodules_this_b12x_does_not_have():
    assert len(GETTERS) >= 6
    assert set(detection._B12X_SUBMODULES) >= {
        "b12x.attention.paged",
        "b12x.gemm.blockscaled",
        "b12x.moe.fused_moe",
    }
    assert all(module is None for module in detection._B12X_SUBMODULES.values())


@pytest.mark.parametrize("name", sorted(detection._B12X_SUBMODULES))
def test_importing_a_probed_name_is_a_clean_import_error(name):
    assert name not in sys.modules
    with pytest.raises(ImportError):  # what vLLM's getter catches; anything else would crash it
        importlib.import_module(name)


@pytest.mark.parametrize("getter", GETTERS)
def test_every_getter_returns_none(getter):
    assert getattr(detection, getter)() is None


def test_vllms_b12x_attention_backend_declines_with_its_own_reason():
    from vllm.v1.attention.backends.b12x import B12xPagedAttentionBackend

    reason = B12xPagedAttentionBackend.supports_combination(
        head_size=128,
        dtype=torch.bfloat16,
        kv_cache_dtype=None,
        block_size=64,
        use_mla=False,
        has_sink=False,
        use_sparse=False,
        use_mm_prefix=False,
        device_capability=DeviceCapability(12, 0),
    )
    assert reason == "Install the b12x backend with `pip install vllm[b12x]`"


@pytest.mark.parametrize("switch", [None, "1"])
def test_has_b12x_is_false_once_vllm_loads_the_plugin(monkeypatch, switch):
    from b12x.integration.vllm import communicator

    monkeypatch.setattr(detection, "_HAS_B12X", detection._HAS_B12X)
    assert detection.has_b12x()  # find_spec("b12x") finds this package
    monkeypatch.setenv("VLLM_PLUGINS", "b12x")
    if switch is None:
        monkeypatch.delenv("B12X_VLLM", raising=False)
    else:
        monkeypatch.setenv("B12X_VLLM", switch)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    try:
        vllm.plugins.load_general_plugins()
    finally:
        communicator.uninstall()
    assert not detection.has_b12x()
