"""The ``b12x`` command: ``doctor``, ``demo`` and ``bench NAME``."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="b12x", description="b12x tools")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("doctor", help="versions, driver, GPUs, peer access, PTX load check")

    demo = sub.add_parser("demo", help="the main job: a miniature TP decode step")
    demo.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all)")

    bench = sub.add_parser("bench", help="benchmarks (table on stdout, JSON with --json)")
    from b12x.bench import add_bench_arguments

    add_bench_arguments(bench)

    args = parser.parse_args(argv)
    if args.command == "doctor":
        from b12x.doctor import run_doctor

        return run_doctor()
    if args.command == "demo":
        from b12x.demo import run_demo

        return run_demo(gpus=args.gpus)
    from b12x.bench import run_bench

    return run_bench(args)


if __name__ == "__main__":
    sys.exit(main())
