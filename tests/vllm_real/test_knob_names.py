"""The all-reduce's knobs carry B12X_ names, which the real vLLM 0.33's environment
check leaves alone (issue 21, item 2); the old VLLM_PCIE_* names are still
read, once each with a warning naming the new one."""

from __future__ import annotations

import logging

import b12x
import pytest
from b12x.comm.pcie import Limits, knobs
from vllm.platforms import current_platform


def test_every_knob_is_a_b12x_name_vllms_strict_check_accepts(monkeypatch):
    for var in knobs._core.ALLREDUCE_ENV.values():
        assert var.startswith("B12X_"), var
    monkeypatch.setenv(knobs.ENV_ONESHOT_MAX, "16KB")
    monkeypatch.setenv(knobs.ENV_TWOSHOT_MAX, "off")
    monkeypatch.setenv(knobs.ENV_TIMEOUT, "30")
    current_platform.validate_environ(hard_fail=True)  # vLLM raises for an unknown VLLM_*
    assert Limits.from_env() == Limits(oneshot_max=16 << 10, twoshot_max=0)


def test_the_old_names_are_read_once_each_with_a_warning_naming_the_new(monkeypatch, caplog):
    old = "VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE"
    assert knobs.DEPRECATED[old] == knobs.ENV_ONESHOT_MAX
    monkeypatch.setenv(old, "16KB")
    # why they had to go: vLLM's strict environment check refuses them
    with pytest.raises(ValueError, match=f"Unknown vLLM environment variable detected: {old}"):
        current_platform.validate_environ(hard_fail=True)
    with caplog.at_level(logging.WARNING, logger="b12x"):
        assert Limits.from_env().oneshot_max == 16 << 10
        assert Limits.from_env().oneshot_max == 16 << 10
    warnings = [r.getMessage() for r in caplog.records if old in r.getMessage()]
    assert warnings == [f"b12x: {old} is deprecated and will be ignored in a later release; "
                        f"set {knobs.ENV_ONESHOT_MAX}"]  # fmt: skip
    monkeypatch.setenv(knobs.ENV_ONESHOT_MAX, "32KB")  # the new name wins
    assert Limits.from_env().oneshot_max == 32 << 10


def test_a_bad_value_under_an_old_name_is_reported_under_that_name(monkeypatch):
    old = "VLLM_PCIE_TWOSHOT_ROW_ELEMS"
    monkeypatch.setenv(old, "many")
    with pytest.raises(b12x.ConfigError, match=f"{old}.*'many'|{old}.*\"many\""):
        Limits.from_env()
