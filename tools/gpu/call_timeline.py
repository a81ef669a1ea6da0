"""Where a whole indexer call's time goes: its kernels' spans, under nsys.

    nsys profile -t cuda -o OUT/timeline python3 tools/gpu/call_timeline.py run [--precision P] CASE
    nsys stats -q -r cuda_gpu_trace -f csv -o OUT/trace OUT/timeline.nsys-rep
    python3 tools/gpu/call_timeline.py summary OUT/trace_cuda_gpu_trace.csv

`run` makes the bench's inputs for CASE and runs the eager call N times (default
30), the bench's L2 flush and a synchronize before each, so every call starts
on an idle GPU and reads its K cache from HBM. `summary` takes the kernels of
each call (those named b12x_indexer*, in launch order) and prints the median
of each kernel's duration, of the gap between one kernel's end and the next
one's start (negative: the next started first, under programmatic dependent
launch), and of the call's span from its first kernel's start to its last
kernel's end; the first call (module load, first launch) is left out.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path


def run(case_name: str, precision: str, calls: int) -> None:
    import torch
    from b12x import _core
    from b12x.attention import dsa_indexer as di
    from b12x.bench.indexer import CASES, make_inputs

    case = CASES[case_name]
    q, w, kcache, table, lengths, aw = make_inputs(case)
    plan = di.plan(
        di.Caps(
            device="cuda",
            num_q_heads=case.heads,
            max_q_rows=case.rows,
            max_page_table_width=case.width,
            topk=case.topk,
            mode="prefill" if case.prefill else "decode",
            precision=precision,
        )
    )
    binding = di.bind(
        plan,
        scratch=torch.empty((plan.nbytes,), dtype=torch.uint8, device="cuda"),
        q_fp8=q,
        query_weights=w,
        index_k_cache=kcache,
        page_table=table,
        cache_lengths=lengths,
        active_width=aw,
        output_indices=torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda"),
    )
    l2 = int(_core.device_info(torch.cuda.current_device())["l2_bytes"])
    flush = torch.zeros(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")
    for _ in range(calls):
        flush.add_(1)
        torch.cuda.synchronize()
        di.run(binding)
    torch.cuda.synchronize()
    print(f"{case_name} ({precision}): {calls} calls, mma flavor {plan.mma_flavor}")


def summary(trace: Path) -> None:
    rows = list(csv.DictReader(trace.open()))
    kernels = [r for r in rows if r["Name"].startswith("b12x_indexer")]
    # a call starts at each launch of the call's first kernel
    first = kernels[0]["Name"]
    calls: list[list[dict[str, str]]] = []
    for r in kernels:
        if r["Name"] == first:
            calls.append([])
        calls[-1].append(r)
    calls = calls[1:]
    names = [r["Name"] for r in calls[0]]
    dur: dict[int, list[float]] = {i: [] for i in range(len(names))}
    gap: dict[int, list[float]] = {i: [] for i in range(1, len(names))}
    span: list[float] = []
    for call in calls:
        if [r["Name"] for r in call] != names:
            continue
        start = [int(r["Start (ns)"]) for r in call]
        end = [s + int(r["Duration (ns)"]) for s, r in zip(start, call, strict=True)]
        for i in range(len(call)):
            dur[i].append((end[i] - start[i]) / 1e3)
            if i:
                gap[i].append((start[i] - end[i - 1]) / 1e3)
        span.append((max(end) - start[0]) / 1e3)
    print(f"{len(span)} calls; medians in us")
    for i, name in enumerate(names):
        line = f"  {name[:60]:60} duration {statistics.median(dur[i]):8.2f}"
        if i:
            line += f"   gap before {statistics.median(gap[i]):7.2f}"
        print(line)
    print(f"  first kernel's start to last kernel's end: {statistics.median(span):.2f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("case")
    r.add_argument("--precision", choices=("exact", "fast"), default="fast")
    r.add_argument("--calls", type=int, default=30)
    s = sub.add_parser("summary")
    s.add_argument("trace", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.case, args.precision, args.calls)
    else:
        summary(args.trace)
    sys.exit(0)
