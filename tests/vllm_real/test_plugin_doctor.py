"""``b12x doctor`` reports the vLLM plugin: entry point, switch, what it turns on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from b12x.integration.vllm import plugin


def doctor(switch):
    env = {k: v for k, v in os.environ.items() if k != plugin.ENV}
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
