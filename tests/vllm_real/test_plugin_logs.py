"""What a vLLM operator sees in vLLM's own log (issue 21, items 1, 3 and 5).

A fresh process loads the plugin through the real vLLM 0.33's loader, as each
vLLM process does, with vLLM configuring its logging itself: b12x's lines
come out formatted by vLLM's handler, the "on" line says what is really on
and why the rest is not, and the name clash with the public b12x is
explained once. With the switch off, b12x says nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# as vLLM's engine core and workers do: configure logging, then load the plugins
LOAD = (
    "from vllm.config.logging import LoggingConfig; from vllm.logger import configure_logging; "
    "configure_logging(LoggingConfig()); "
    "import vllm.plugins; vllm.plugins.load_general_plugins()"
)
# vLLM's own format: "(Process pid=N) LEVEL MM-DD HH:MM:SS [file.py:line] message"
VLLM_LINE = (
    r"^(?:\(\w+ pid=\d+\) )?(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d "
    r"\[(?P<file>[\w.]+):\d+\] (?P<msg>.*)$"
)


def vllm_log(switch: str | None, **env: str) -> list[tuple[str, str, str]]:
    """(level, file, message) of every line vLLM's handler wrote while loading plugins."""
    environ = {k: v for k, v in os.environ.items() if k != "B12X_VLLM"}
    environ.update(VLLM_TARGET_DEVICE="cpu", VLLM_PLUGINS="b12x", VLLM_CONFIGURE_LOGGING="1")
    environ.update(env)
    if switch is not None:
        environ["B12X_VLLM"] = switch
    done = subprocess.run(
        [sys.executable, "-c", LOAD], capture_output=True, text=True, env=environ, timeout=300
    )
    assert done.returncode == 0, done.stderr
    lines = []
    for line in (done.stdout + done.stderr).splitlines():
        m = re.match(VLLM_LINE, line)
        if m:
            lines.append((m.group(1), m.group("file"), m.group("msg")))
        else:  # anything b12x writes must have gone through vLLM's handler
            assert "b12x" not in line, line
    return lines


def b12x_lines(lines):
    return [(level, f, msg) for level, f, msg in lines if "b12x" in msg]


def test_with_the_switch_on_b12x_speaks_through_vllms_handler():
    lines = b12x_lines(vllm_log("all"))
    on = [msg for _, _, msg in lines if msg.startswith("b12x vLLM plugin on:")]
    # the all-reduce is on; the indexer is not, here (vLLM's CPU platform), and says why
    assert on == [
        "b12x vLLM plugin on: allreduce; not used: indexer (vLLM's platform is 'cpu', not CUDA)"
    ]
    assert any(f == "plugin.py" for _, f, _ in lines)
    assert sum("b12x indexer not used: vLLM's platform is 'cpu'" in m for _, _, m in lines) == 1
    clash = [m for _, _, m in lines if "pip install vllm[b12x]" in m]
    assert len(clash) == 1 and "replaces this b12x" in clash[0]


def test_the_on_line_names_only_what_was_asked_for():
    on = [m for _, _, m in b12x_lines(vllm_log("allreduce")) if "plugin on" in m]
    assert on == ["b12x vLLM plugin on: allreduce"]


@pytest.mark.parametrize("switch", [None, "0", "off"])
def test_with_the_switch_off_b12x_says_nothing(switch):
    assert b12x_lines(vllm_log(switch)) == []
