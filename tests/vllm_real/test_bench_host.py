"""``b12x bench host`` against the real vLLM 0.33: both slots are timed through
vLLM's own ``CudaCommunicator.all_reduce`` and launch once per call; the
indexer half says why it skips without a GPU. (The figures themselves are the
benchmark's business, never a test's.)"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from b12x.bench import host


def small_run() -> object:
    args = argparse.Namespace(number=50, repeats=2, tokens=16, hidden=7168, json=None)
    return host.run(args)


def test_the_all_reduce_arms_run_through_vllms_dispatcher_and_launch_once():
    result = small_run()
    rows = {r["arm"]: r for r in result.results if r["case"].startswith("allreduce_slot")}
    assert set(rows) == {"floor_dispatch_and_alloc", "b12x_slot", "vllm_custom_allreduce"}
    assert rows["b12x_slot"]["launches_per_call"] == 1.0
    assert rows["vllm_custom_allreduce"]["launches_per_call"] == 1.0
    for arm in ("b12x_slot", "vllm_custom_allreduce"):
        row = rows[arm]
        assert len(row["samples_us"]) == 2
        assert row["own_us"] == row["median_us"] - rows["floor_dispatch_and_alloc"]["median_us"]
    assert any("b12x's own host time" in n for n in result.notes)


def test_the_indexer_half_runs_or_says_why_not():
    result = small_run()
    indexer = [r for r in result.results if r["case"].startswith("indexer_run")]
    if torch.cuda.is_available():
        arms = {"b12x_run", "b12x_bind_and_run", "bare_launches_empty_kernel"}
        assert {r["arm"] for r in indexer} == arms
        assert len({r["launches_per_call"] for r in indexer}) == 1  # the same number of launches
    else:
        assert indexer == []
        assert any(n.startswith("indexer half skipped: needs a CUDA GPU") for n in result.notes)


def test_the_command_writes_every_sample(tmp_path):
    path = tmp_path / "host.json"
    done = subprocess.run(
        [sys.executable, "-m", "b12x", "bench", "host", "--number", "20", "--repeats", "2",
         "--json", str(path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    doc = json.loads(path.read_text())
    assert doc["meta"]["config"]["number"] == 20
    assert all(len(r["samples_us"]) == 2 for r in doc["results"])
