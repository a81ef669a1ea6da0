"""The ``b12x`` command: ``doctor``, ``demo`` and ``bench NAME``.

Exit codes: 0 success, 1 a runtime failure (a B12xError, a file that cannot be
written, a machine without the GPUs a command needs: one line on stderr, no
traceback), 2 a usage error (argparse: a bad argument, refused before any work
starts), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys

from b12x._cli_args import Unavailable, non_negative_int
from b12x.errors import B12xError


def build_parser() -> argparse.ArgumentParser:
    from b12x import __version__

    parser = argparse.ArgumentParser(prog="b12x", description="b12x tools")
    parser.add_argument("--version", action="version", version=f"b12x {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("doctor", help="versions, driver, GPUs, peer access, PTX load check")

    demo = sub.add_parser("demo", help="the main job: a miniature TP decode step")
    demo.add_argument(
        "--gpus",
        type=non_negative_int,
        default=None,
        help="GPUs to use (default: all): 0 runs only the CPU steps, 1 adds the GPU "
        "indexer step, 2 or more the multi-GPU layer step too",
    )

    bench = sub.add_parser("bench", help="benchmarks (table on stdout, JSON with --json)")
    from b12x.bench import add_bench_arguments

    add_bench_arguments(bench)
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "doctor":
        from b12x.doctor import run_doctor

        return run_doctor()
    if args.command == "demo":
        from b12x.demo import run_demo

        return run_demo(gpus=args.gpus)
    from b12x.bench import run_bench

    return run_bench(args)


def _expected_failures() -> tuple[type[BaseException], ...]:
    """What a user can cause or fix without a code change: one line, exit 1."""
    kinds: list[type[BaseException]] = [B12xError, Unavailable, OSError, ModuleNotFoundError]
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "OutOfMemoryError"):
        kinds.append(torch.OutOfMemoryError)
    return tuple(kinds)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # usage errors exit 2 here
    name = "b12x " + " ".join(filter(None, (args.command, getattr(args, "bench", None))))
    try:
        return _run(args)
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if not isinstance(e, _expected_failures()):
            raise  # a bug: keep its traceback
        print(f"{name}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
