"""Where a whole indexer call's time goes: its kernels' spans on the GPU.

    python3 tools/gpu/call_timeline.py [--precision P] [--calls N] CASE [--trace OUT.json]

Makes the bench's inputs for CASE and runs the eager call N times (default
30), the bench's L2 flush and a synchronize before each, so every call starts
on an idle GPU and reads its K cache from HBM, under torch.profiler (CUPTI's
kernel records; the GPU hosts have no nsys). Then it takes each call's kernels
(those named b12x_indexer*, in start order) and prints the median of each
kernel's duration, of the gap between one kernel's end and the next one's
start (negative: the next started first, under programmatic dependent
launch), and of the call's span from its first kernel's start to its last
kernel's end; the first call (module load, first launch) is left out.
``--trace`` keeps the kernel records as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any


def run(case_name: str, precision: str, calls: int) -> list[dict[str, Any]]:
    import torch
    from b12x.attention import dsa_indexer as di
    from b12x.bench.common import l2_flusher
    from indexer_profile import case_binding
    from torch.profiler import ProfilerActivity, profile

    binding = case_binding(case_name, precision)
    plan = binding.plan
    flush = l2_flusher(torch.cuda.current_device())

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            torch.cuda.synchronize()
            di.run(binding)
        torch.cuda.synchronize()
    print(f"{case_name} ({precision}): {calls} calls, mma flavor {plan.mma_flavor}")
    # the chrome trace's kernel records: start and duration in us, GPU clock
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    kernels = [
        {"name": e["name"], "start_us": float(e["ts"]), "dur_us": float(e["dur"])}
        for e in events
        if e.get("cat") == "kernel" and e.get("name", "").startswith("b12x_indexer")
    ]
    return sorted(kernels, key=lambda k: k["start_us"])


def summary(kernels: list[dict[str, Any]]) -> None:
    # a call starts at each launch of the call's first kernel
    first = kernels[0]["name"]
    calls: list[list[dict[str, Any]]] = []
    for r in kernels:
        if r["name"] == first:
            calls.append([])
        calls[-1].append(r)
    calls = calls[1:]
    names = [r["name"] for r in calls[0]]
    dur: dict[int, list[float]] = {i: [] for i in range(len(names))}
    gap: dict[int, list[float]] = {i: [] for i in range(1, len(names))}
    span: list[float] = []
    for call in calls:
        if [r["name"] for r in call] != names:
            continue
        start = [float(r["start_us"]) for r in call]
        end = [s + float(r["dur_us"]) for s, r in zip(start, call, strict=True)]
        for i in range(len(call)):
            dur[i].append(end[i] - start[i])
            if i:
                gap[i].append(start[i] - end[i - 1])
        span.append(max(end) - start[0])
    print(f"{len(span)} calls; medians in us")
    for i, name in enumerate(names):
        line = f"  {name[:60]:60} duration {statistics.median(dur[i]):8.2f}"
        if i:
            line += f"   gap before {statistics.median(gap[i]):7.2f}"
        print(line)
    print(f"  first kernel's start to last kernel's end: {statistics.median(span):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("case")
    ap.add_argument("--precision", choices=("exact", "fast"), default="fast")
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--trace", type=Path)
    args = ap.parse_args()
    kernels = run(args.case, args.precision, args.calls)
    if args.trace:
        args.trace.write_text(json.dumps(kernels))
    summary(kernels)
