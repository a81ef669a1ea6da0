"""Indexer host overhead: plan (cold, hit, rebuilt every call) and bind (eight tensors)."""

from __future__ import annotations

import argparse

from b12x import _core
from b12x._cli_args import device, indexer_topk, positive_int
from b12x.bench.common import BenchResult, time_per_call_us

TARGETS_US = {"plan_hit": 0.5, "bind": 4.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--number", type=positive_int, default=20000, help="calls per sample")
    p.add_argument("--repeats", type=positive_int, default=7, help="samples per arm")
    p.add_argument(
        "--device", type=device, default=None, help="cpu or cuda[:N] (default: cuda if usable)"
    )
    p.add_argument("--rows", type=positive_int, default=64)
    p.add_argument("--heads", type=positive_int, default=64)
    p.add_argument("--width", type=positive_int, default=512, help="page-table width in pages")
    p.add_argument("--topk", type=indexer_topk, default=512, help="512, 1024 or 2048")


def _device(arg: str | None) -> str:
    if arg:
        return arg
    from b12x import cuda

    return "cuda" if cuda.is_available() else "cpu"


def run(args: argparse.Namespace) -> BenchResult:
    import torch

    from b12x.attention import dsa_indexer as di

    device = torch.device(_device(args.device))
    rows, heads, width, topk = args.rows, args.heads, args.width, args.topk
    config = {
        "number": args.number,
        "repeats": args.repeats,
        "device": str(device),
        "rows": rows,
        "heads": heads,
        "width": width,
        "topk": topk,
    }
    result = BenchResult("plan", config)
    n, r = args.number, args.repeats
    caps = di.Caps(
        device=device, num_q_heads=heads, max_q_rows=rows, max_page_table_width=width, topk=topk
    )
    di.clear_caches()

    def cold() -> object:
        di.clear_caches()
        return di.plan(caps)

    # plan_cold: intern-cache miss (build + insert); rebuild_plan: no cache at all
    result.add("plan_cold", "b12x_clear_then_plan", time_per_call_us(cold, max(n // 10, 1), r))
    result.add(
        "rebuild_plan",
        "b12x_uncached_plan_every_call",
        time_per_call_us(lambda: _core.indexer_build_plan(caps), max(n // 10, 1), r),
    )

    plan = di.plan(caps)
    result.add("plan_hit", "b12x_interned", time_per_call_us(lambda: di.plan(caps), n, r))
    # peer: the adapter-side dict vLLM keeps today, keyed per call by a fresh tuple
    plans = {(device, heads, rows, width, False): plan}
    result.add(
        "plan_hit",
        "python_dict_tuple_key",
        time_per_call_us(lambda: plans[(device, heads, rows, width, False)], n, r),
    )

    pages = width + 8
    tensors = {
        "scratch": torch.empty(plan.nbytes, dtype=torch.uint8, device=device),
        "q_fp8": torch.zeros(
            (rows, heads, di.INDEX_HEAD_DIM), dtype=torch.float8_e4m3fn, device=device
        ),
        "query_weights": torch.zeros((rows, heads), dtype=torch.float32, device=device),
        "index_k_cache": torch.zeros(
            (pages, di.INDEX_PAGE_BYTES), dtype=torch.uint8, device=device
        ),
        "page_table": torch.zeros((rows, width), dtype=torch.int32, device=device),
        "cache_lengths": torch.zeros(rows, dtype=torch.int32, device=device),
        "active_width": torch.zeros(1, dtype=torch.int32, device=device),
        "output_indices": torch.empty((rows, topk), dtype=torch.int32, device=device),
    }
    scores = torch.empty((rows, topk), dtype=torch.float32, device=device)
    bind = di.bind
    t = tensors

    def bind8() -> object:
        return bind(
            plan,
            scratch=t["scratch"],
            q_fp8=t["q_fp8"],
            query_weights=t["query_weights"],
            index_k_cache=t["index_k_cache"],
            page_table=t["page_table"],
            cache_lengths=t["cache_lengths"],
            active_width=t["active_width"],
            output_indices=t["output_indices"],
        )

    def bind9() -> object:
        return bind(
            plan,
            scratch=t["scratch"],
            q_fp8=t["q_fp8"],
            query_weights=t["query_weights"],
            index_k_cache=t["index_k_cache"],
            page_table=t["page_table"],
            cache_lengths=t["cache_lengths"],
            active_width=t["active_width"],
            output_indices=t["output_indices"],
            output_scores=scores,
        )

    values = list(tensors.values())

    def python_reads() -> None:
        # the floor: the torch attribute reads any bind needs, done in Python
        for x in values:
            (x.dtype, x.is_cuda, x.is_cpu, x.shape, x.stride(), x.data_ptr())

    nb = max(n // 4, 1)
    result.add("bind", "b12x_8_tensors", time_per_call_us(bind8, nb, r), tensors=8)
    result.add("bind", "b12x_9_tensors_with_scores", time_per_call_us(bind9, nb, r), tensors=9)
    result.add("bind", "python_attr_reads_8_tensors", time_per_call_us(python_reads, nb, r))

    for case, arm in (("plan_hit", "b12x_interned"), ("bind", "b12x_8_tensors")):
        got, target = result.median(case, arm), TARGETS_US[case]
        verdict = "meets" if got <= target else "MISSES"
        result.notes.append(f"{case}: {got:.3f} us median, {verdict} the {target} us target")
    rebuild = result.median("rebuild_plan", "b12x_uncached_plan_every_call")
    result.notes.append(
        f"rebuild_plan / plan_hit = {rebuild / result.median('plan_hit', 'b12x_interned'):.0f}x"
    )
    di.clear_caches()
    return result
