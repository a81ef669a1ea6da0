"""``b12x demo``: a miniature DeepSeek V4 tensor-parallel decode step.

Each step runs where this machine allows and checks its own result:

1. CPU: the C4 indexer through the vLLM adapter (reference path) for decode
   rows and one-request prefill chunks, checked against the reference;
2. CPU: the model's all-reduces declared through the all-reduce adapter, and
   live lookups that hit or decline;
3. one GPU: the indexer kernels through the adapter under a CUDA graph,
   replayed after rewriting the metadata, checked against the reference;
4. two or more GPUs (one spawned process each): the layer's fused all-reduce
   + residual add + RMSNorm against NCCL + RMSNorm, eager and in graphs.

A step that this machine or this build cannot run is skipped with its reason.
Exits 1 if any check fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from b12x._demo import StepResult


def _header() -> None:
    import torch

    from b12x import _core

    driver = "none: CPU paths only"
    if _core.driver_present():
        try:
            driver = f"CUDA {'.'.join(map(str, _core.driver_version()))}, "
            driver += f"{_core.device_count()} GPU(s)"
        except Exception as e:  # a broken driver is a finding, not a crash
            driver = f"error: {e}"
    print("b12x demo: a miniature DeepSeek V4 tensor-parallel decode step")
    print(f"  b12x {_core.__version__} | torch {torch.__version__} | driver {driver}")
    print("  (b12x doctor for the full report)\n")


def _print_table(rows: list[StepResult]) -> None:
    headers = ("step", "where", "check", "time", "result")
    cells = [(r.step, r.where, r.status, r.time, r.result) for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(headers[:4])]
    line = "  ".join(h.ljust(w) for h, w in zip(headers[:4], widths, strict=True)) + "  result"
    print(line)
    print("-" * len(line))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c[:4], widths, strict=True)) + "  " + c[4])


def _guarded(step: Callable[[], StepResult], name: str) -> StepResult:
    """Runs one step; an unexpected exception is that step's failure, not the demo's."""
    try:
        return step()
    except Exception as e:
        return StepResult(name, "-", f"error: {type(e).__name__}: {e}", status="FAIL")


def run_demo(gpus: int | None = None) -> int:
    """Runs every step, prints the table, returns the exit code (1 on any failure)."""
    from b12x._demo.indexer_steps import cpu_indexer_step, gpu_indexer_step
    from b12x._demo.lookup_step import lookup_step
    from b12x._demo.tp_step import tp_step

    _header()
    started = time.perf_counter()
    steps: list[tuple[str, Callable[[], StepResult]]] = [
        ("indexer: decode + prefill (adapter)", cpu_indexer_step),
        ("all-reduce: declared lookups (adapter)", lookup_step),
    ]
    if gpus is None or gpus >= 1:
        steps.append(("indexer: decode, CUDA graph", gpu_indexer_step))
    if gpus is None or gpus >= 2:
        steps.append(("layer step: fused all-reduce + RMSNorm", lambda: tp_step(gpus)))
    results = [_guarded(step, name) for name, step in steps]
    _print_table(results)
    failed = [r.step for r in results if r.status == "FAIL"]
    ran = sum(r.status == "ok" for r in results)
    skipped = sum(r.status == "skip" for r in results)
    print(
        f"\n{ran} passed, {len(failed)} failed, {skipped} skipped "
        f"in {time.perf_counter() - started:.1f} s"
    )
    return 1 if failed else 0
