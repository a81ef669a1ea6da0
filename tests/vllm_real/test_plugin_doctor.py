"""``b12x doctor`` reports the vLLM plugin: entry point, switch, what it turns on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from b12x.integration.vllm import plugin


def doctor(switch, **extra):
    env = {k: v for k, v in os.environ.items() if k not in (plugin.ENV, "VLLM_PLUGINS")}
    env.update(extra)
    if switch is not None:
        env[plugin.ENV] = switch
    done = subprocess.run(
        [sys.executable, "-m", "b12x", "doctor"], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_doctor_says_off_by_default():
    out = doctor(None)
    assert "vLLM plugin            entry point registered; vLLM 0.33.0" in out
    assert "B12X_VLLM              unset: off, vLLM runs as stock" in out


def test_doctor_lists_what_the_switch_turns_on():
    out = doctor("allreduce")
    assert "B12X_VLLM              'allreduce': on; vLLM gets:" in out
    assert "all-reduce in vLLM's custom all-reduce slot" in out
    assert "sparse indexer" not in out


def test_doctor_names_the_variable_of_a_bad_switch_and_still_exits_0():
    out = doctor("sometimes")
    assert "B12X_VLLM              'sometimes': B12X_VLLM: value expected one of" in out


@pytest.mark.parametrize(
    ("switch", "components"),
    [(None, []), ("on", ["allreduce", "indexer"]), ("indexer", ["indexer"])],
)
def test_status(switch, components):
    env = {} if switch is None else {plugin.ENV: switch}
    state = plugin.status(env)
    assert state["entry_point"] is True and state["vllm"] == "0.33.0"
    assert state["switch"] == switch and state["components"] == components
    assert list(state["would_enable"]) == components
    assert "error" not in state
    assert plugin.status({plugin.ENV: "x"})["error"].startswith("B12X_VLLM: value expected")


def test_doctor_says_when_vllm_will_not_load_the_plugin():
    # issue 21, item 4: VLLM_PLUGINS decides which plugins vLLM loads
    out = doctor("all", VLLM_PLUGINS="lora_resolver")
    assert "NOT loaded: VLLM_PLUGINS='lora_resolver' does not name b12x" in out
    assert "'all': on, but vLLM does not load the plugin: vLLM runs as stock" in out
    assert "vLLM gets" not in out
    out = doctor("all", VLLM_PLUGINS="lora_resolver,b12x")
    assert "NOT loaded" not in out and "'all': on; vLLM gets:" in out
    # vLLM's own split: the name " b12x" is not "b12x" (vllm/envs.py, plugins/__init__.py)
    out = doctor("all", VLLM_PLUGINS="lora_resolver, b12x")
    assert "NOT loaded: VLLM_PLUGINS='lora_resolver, b12x' does not name b12x" in out


def test_doctor_says_why_the_indexer_would_not_be_used_here():
    out = doctor("indexer")
    if not torch.cuda.is_available():
        assert (
            "not used           no GPU here the indexer kernels run on (FP8 MMA needs sm_89+)"
            "; vLLM's own indexer runs" in out
        )
    else:  # each GPU's row gives the speed rule's decision (test_gpu_plugin.py)
        assert "vLLM indexer with B12X_VLLM=indexer: " in out
        from b12x.attention import dsa_indexer

        if any(map(dsa_indexer.is_supported, range(torch.cuda.device_count()))):
            assert "no GPU here the indexer kernels run on" not in out
