"""Is the fast prefill call slower than its scorer plus its top-k? (round 19)

`b12x bench indexer` times its arms one after another, 50 replays each, and
the H200's clocks drift under a long FP8 load: the scorer alone measures
~1.57 ms early in its arm and ~1.72 ms late. This times the whole fast
prefill call, its scorer alone (a score-only plan) and its top-k alone (a
top-k-only plan over the call's scratch) interleaved, one replay of each in
turn with the bench's L2 flush before each, so every triple sees the same
clocks; the SM clock is read every 10 triples. Prints the medians and the
median of (whole - scorer - top-k) over the triples, writes every sample.

    python3 tools/gpu/prefill_gap_probe.py OUT.json [triples]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from functools import partial

import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.bench.common import capture_graph, l2_flusher
from b12x.bench.indexer import CASES, make_inputs


def sm_clock_mhz() -> int:
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=clocks.sm", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return int(out.stdout.split()[0]) if out.stdout.strip() else -1


def main() -> int:
    path = sys.argv[1]
    triples = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    case = CASES["prefill_r4096_L32768"]
    q, w, kcache, table, lengths, aw = make_inputs(case)
    caps = di.Caps(
        device="cuda", num_q_heads=case.heads, max_q_rows=case.rows,
        max_page_table_width=case.width, topk=case.topk, mode="prefill", precision="fast",
    )  # fmt: skip
    idx = torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda")

    def bind(plan, scratch=None):
        if scratch is None:
            scratch = torch.empty((plan.nbytes,), dtype=torch.uint8, device="cuda")
        return di.bind(
            plan, scratch=scratch, q_fp8=q, query_weights=w, index_k_cache=kcache,
            page_table=table, cache_lengths=lengths, active_width=aw, output_indices=idx,
        )  # fmt: skip

    whole = bind(di.plan(caps))
    arms = {
        "whole": whole,
        "scorer": bind(_core.indexer_build_plan(caps, score_only=True)),
        "topk": bind(_core.indexer_build_plan(caps, topk_only=True), scratch=whole.scratch),
    }
    graphs = {name: capture_graph(partial(di.run, b)) for name, b in arms.items()}
    flush = l2_flusher(torch.cuda.current_device())
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    clocks = []
    for g in graphs.values():  # warm-up
        g.replay()
    for t in range(triples):
        if t % 10 == 0:
            torch.cuda.synchronize()
            clocks.append(sm_clock_mhz())
        for name, g in graphs.items():
            flush()
            start.record()
            g.replay()
            stop.record()
            stop.synchronize()
            samples[name].append(start.elapsed_time(stop) * 1e3)
    gaps = [
        a - b - c
        for a, b, c in zip(samples["whole"], samples["scorer"], samples["topk"], strict=True)
    ]
    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"SM clock (MHz, every 10 triples): {clocks}")
    for name, m in med.items():
        print(f"{name:7} median {m:8.1f} us  min {min(samples[name]):8.1f}")
    print(f"whole - scorer - topk, median over the triples: {statistics.median(gaps):.1f} us")
    with open(path, "w") as f:
        json.dump({"samples_us": samples, "gap_us": gaps, "sm_clock_mhz": clocks}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
