"""``b12x bench NAME [--json FILE]``: benchmarks with a peer arm in the same run.

Each benchmark module exposes ``add_arguments(parser)`` and ``run(args) ->
BenchResult``; results print as a table and, with ``--json``, are written as
``{"meta": {...}, "results": [{"case", "arm", "median_us", "samples_us", ...}]}``.

Arguments are checked by the parser (``b12x._cli_args`` types); an
``add_arguments`` may also ``set_defaults(preflight=check)``, a check of the
machine (e.g. ``require_gpus``) that runs before the benchmark does: a
machine it cannot run on is one line on stderr and exit 1, with no table and
no JSON written.
"""

from __future__ import annotations

import argparse
import importlib

from b12x._cli_args import output_file
from b12x.bench.common import BenchResult, write_report

# name -> module under b12x.bench (imported on use: benches may need a GPU)
BENCHES = {
    "extract": "extract",
    "allreduce": "allreduce",
    "plan": "plan",
    "indexer": "indexer",
    "lookup": "lookup",
    "host": "host",
}


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", required=True)
    for name, module in BENCHES.items():
        mod = importlib.import_module(f"b12x.bench.{module}")
        p = sub.add_parser(name, help=(mod.__doc__ or "").strip().splitlines()[0])
        p.add_argument(
            "--json", metavar="FILE", type=output_file, help="write every sample as JSON"
        )
        mod.add_arguments(p)


def run_bench(args: argparse.Namespace) -> int:
    mod = importlib.import_module(f"b12x.bench.{BENCHES[args.bench]}")
    preflight = getattr(args, "preflight", None)
    if preflight is not None:
        preflight(args)
    result: BenchResult = mod.run(args)
    write_report(result, args.json)
    return 0 if result.ok else 1
