"""b12x's vLLM plugin through vLLM's own loader (``vllm.plugins.load_general_plugins``).

Item 2 of issue 12: nothing let stock vLLM select b12x (no plugin, no switch).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata as metadata
import logging
import sys
import types

import b12x
import pytest
import torch
import vllm.plugins
from b12x.integration.vllm import communicator, patches, plugin


@pytest.fixture
def load(monkeypatch):
    """Runs vLLM's plugin loader as a fresh process would, with B12X_VLLM=value."""
    monkeypatch.setenv("VLLM_PLUGINS", "b12x")
    import vllm.utils.b12x as detection

    monkeypatch.setattr(detection, "_HAS_B12X", detection._HAS_B12X)

    def run(value):
        if value is None:
            monkeypatch.delenv("B12X_VLLM", raising=False)
        else:
            monkeypatch.setenv("B12X_VLLM", value)
        monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
        vllm.plugins.load_general_plugins()

    communicator.uninstall()
    yield run
    communicator.uninstall()


@pytest.fixture
def indexer_hooks(monkeypatch):
    """The indexer half's ``install_reason`` (another module of b12x), recording its calls."""
    calls = []
    module = types.ModuleType(plugin.INDEXER_HOOKS)
    module.__spec__ = importlib.machinery.ModuleSpec(plugin.INDEXER_HOOKS, loader=None)
    module.install_reason = lambda vllm_config=None: calls.append(vllm_config) or None
    monkeypatch.setitem(sys.modules, plugin.INDEXER_HOOKS, module)
    return calls


def stock_slot():
    import vllm.distributed.device_communicators.custom_all_reduce as slot

    return slot.CustomAllreduce


def test_the_installed_b12x_registers_the_entry_point():
    points = [p for p in metadata.entry_points(group="vllm.general_plugins") if p.name == "b12x"]
    assert [p.value for p in points] == [plugin.ENTRY_POINT]
    assert points[0].load() is plugin.register


@pytest.mark.parametrize("value", [None, "", "0", "off", " OFF ", "false", "no"])
def test_switch_off_leaves_vllm_stock(load, indexer_hooks, value):
    load(value)
    assert stock_slot() is not communicator.B12xCustomAllreduce
    assert not communicator.installed()
    assert indexer_hooks == []


@pytest.mark.parametrize("value", ["1", "on", "ON", "true", "yes", "all", "indexer,allreduce"])
def test_switch_on_installs_everything(load, indexer_hooks, value):
    load(value)
    assert stock_slot() is communicator.B12xCustomAllreduce
    assert communicator.installed()
    assert indexer_hooks == [None]  # called once, with vLLM's current config (none here)
    assert hasattr(torch.ops.b12x, "fused_all_reduce_add_rms_norm")


def test_switch_can_name_one_component(load, indexer_hooks):
    load("allreduce")
    assert communicator.installed() and indexer_hooks == []
    communicator.uninstall()
    load(" Indexer ")
    assert not communicator.installed() and indexer_hooks == [None]


@pytest.mark.parametrize("value", ["2", "maybe", "allreduce,gemm", "on,off"])
def test_a_bad_switch_stops_vllm_with_an_error_naming_it(load, indexer_hooks, value):
    with pytest.raises(b12x.ConfigError, match=r"^B12X_VLLM: value expected one of .* got "):
        load(value)
    assert isinstance(b12x.ConfigError("x"), ValueError)
    assert not communicator.installed() and indexer_hooks == []


def test_loading_again_installs_once(load, indexer_hooks, caplog):
    with caplog.at_level(logging.INFO, logger="b12x"):
        load("1")
        stock = patches.original(communicator._SLOT_MODULE, "CustomAllreduce")
        plugin.register()  # vLLM may load plugins again in the same process
    # vLLM's own class kept, not b12x's
    assert patches.original(communicator._SLOT_MODULE, "CustomAllreduce") is stock
    assert stock is not communicator.B12xCustomAllreduce
    assert caplog.text.count("installed in vLLM's custom all-reduce slot") == 1
    communicator.uninstall()
    assert stock_slot() is stock


def test_without_indexer_hooks_the_all_reduce_still_installs(load, monkeypatch, caplog):
    monkeypatch.setattr(plugin, "INDEXER_HOOKS", "b12x.integration.vllm._no_such_hooks")
    with caplog.at_level(logging.INFO, logger="b12x"):
        load("on")
    assert communicator.installed()
    assert "plugin on: allreduce; not used: indexer (this b12x has no indexer hooks" in caplog.text
