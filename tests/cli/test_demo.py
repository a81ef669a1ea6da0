"""``b12x demo`` on this machine: exit code, table, and that its checks can fail."""

from __future__ import annotations

import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from b12x import demo
from b12x._demo import StepResult, indexer_steps, lookup_step
from b12x.integration.vllm import indexer as indexer_mod


def _line(out: str, step: str) -> str:
    lines = [line for line in out.splitlines() if line.startswith(step)]
    assert len(lines) == 1, out
    return lines[0]


def test_cpu_demo_runs_from_the_command_line():
    run = subprocess.run(
        [sys.executable, "-m", "b12x", "demo", "--gpus", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert out.startswith("b12x demo: a miniature DeepSeek V4 tensor-parallel decode step")
    assert "step" in out and "check" in out and "result" in out

    indexer = _line(out, "indexer: decode + prefill (adapter)")
    assert " ok " in indexer
    assert "4 decode + 16 prefill rows (2 one-request chunks)" in indexer
    assert "matches reference" in indexer

    lookups = _line(out, "all-reduce: declared lookups (adapter)")
    assert " ok " in lookups
    assert re.search(r"\d+/854 routed", lookups)
    assert re.search(r"hits (\d+)/\1, misses (\d+)/\2", lookups)
    assert "indexer: decode, CUDA graph" not in out  # --gpus 0: no GPU steps
    assert "2 passed, 0 failed" in out


def test_gpu_steps_skip_with_a_reason_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert indexer_steps.gpu_indexer_step().result == "skipped: no CUDA GPU"
    from b12x._demo.tp_step import tp_step

    result = tp_step(None)
    assert result.status == "skip" and result.result == "skipped: no CUDA GPU"


def test_a_failed_check_fails_the_demo(monkeypatch, capsys):
    def bad_step():
        return StepResult("all-reduce: declared lookups (adapter)", "cpu", "MISMATCH", "-", "FAIL")

    monkeypatch.setattr(lookup_step, "lookup_step", bad_step)
    assert demo.run_demo(gpus=0) == 1
    assert "1 failed" in capsys.readouterr().out


def test_an_exception_in_a_step_is_that_steps_failure(monkeypatch, capsys):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setattr(indexer_steps, "cpu_indexer_step", broken)
    assert demo.run_demo(gpus=0) == 1
    out = capsys.readouterr().out
    assert "error: RuntimeError: boom" in _line(out, "indexer: decode + prefill (adapter)")


def test_the_indexer_step_catches_a_wrong_selection(monkeypatch):
    from b12x.attention import dsa_indexer

    def run(binding):
        dsa_indexer.run(binding)
        binding.output_indices[0, 0] = binding.output_indices[0, 1]  # a duplicate index

    corrupt = SimpleNamespace(**{k: getattr(dsa_indexer, k) for k in dir(dsa_indexer)})
    corrupt.run = run
    monkeypatch.setattr(indexer_mod, "_dsa_indexer", lambda: corrupt)
    result = indexer_steps.cpu_indexer_step()
    assert result.status == "FAIL"
    assert "MISMATCH" in result.result
