"""``b12x bench NAME [--json FILE]``: benchmarks with a peer arm in the same run.

Each benchmark module exposes ``add_arguments(parser)`` and ``run(args) ->
BenchResult``; results print as a table and, with ``--json``, are written as
``{"meta": {...}, "results": [{"case", "arm", "median_us", "samples_us", ...}]}``.
"""

from __future__ import annotations

import argparse
import importlib

from b12x.bench.common import BenchResult, write_report

# name -> module under b12x.bench (imported on use: benches may need a GPU)
BENCHES = {
    "extract": "extract",
    "allreduce": "allreduce",
    "plan": "plan",
    "indexer": "indexer",
    "lookup": "lookup",
}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        mod = importlib.import_module(f"b12x.bench.{module}")
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        p.add_argument("--json", metavar="FILE", help="write every sample as JSON")
        mod.add_arguments(p)


def run_bench(args: argparse.Namespace) -> int:
    mod = importlib.import_module(f"b12x.bench.{BENCHES[args.bench]}")
    result: BenchResult = mod.run(args)
    write_report(result, args.json)
    return 0 if result.ok else 1
