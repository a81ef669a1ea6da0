"""Declared-plan lookup from Python: b12x vs a pure-Python dict index vs a linear scan.

Reproduces the seed benchmark of b12x's collectives reference with the
three arms in one process: for N declarations of ``(r, 16)`` bf16 plain
all-reduces (r = 1..N), time ``has_plan_for(tensor)`` on a CPU tensor that
matches the last declaration (``hit``, the scan's worst case) and on an
undeclared ``(N + 1, 16)`` tensor (``miss``). Each arm gets 100 untimed
calls, then ``repeats`` samples of ``iterations`` calls (``timeit``). The
default N = 64, 512, 4096 finishes in about a minute on two cores;
``--full`` adds N = 65536 (the scan's O(N) calls take many minutes there).
Progress goes to stderr, one line per measured arm.

* ``scan``: the predecessor's linear scan, with its per-call import, the
  O(N) error message and the raise/catch on a miss
  (:class:`b12x.bench.lookup_baselines.ScanCommunicator`);
* ``dict``: the pure-Python dict index with singleton-stride normalisation
  and the debug-log call on a miss
  (:class:`b12x.bench.lookup_baselines.DictCommunicator`);
* ``b12x``: :meth:`b12x.comm.pcie.DeclaredPlanIndex.has_plan_for`.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import timeit
from pathlib import Path
from typing import Any

from b12x._cli_args import non_negative_int, positive_int
from b12x.bench.common import BenchResult

ARMS = ("scan", "dict", "b12x")
DEFAULT_N = (64, 512, 4096)
FULL_N = (*DEFAULT_N, 65536)

# DESIGN.md §5 targets for the b12x arm
FLAT_MAX_OVER_MIN = 1.5
MAX_FRACTION_OF_DICT = 0.4
MIN_SPEEDUP_OVER_SCAN = 1000.0
SCAN_TARGET_DECLARATIONS = 4096


def add_arguments(p: argparse.ArgumentParser) -> None:
    sizes = p.add_mutually_exclusive_group()  # --full with a list would drop one of them
    sizes.add_argument(
        "--declarations",
        type=positive_int,
        nargs="+",
        default=None,
        help=f"numbers of declarations N (default: {' '.join(map(str, DEFAULT_N))})",
    )
    sizes.add_argument(
        "--full", action="store_true", help=f"the full sweep, N = {' '.join(map(str, FULL_N))}"
    )
    p.add_argument("--iterations", type=positive_int, default=1000, help="calls per sample")
    p.add_argument("--repeats", type=positive_int, default=5, help="samples per arm and case")
    p.add_argument(
        "--warmup", type=non_negative_int, default=100, help="untimed calls before timing"
    )
    p.add_argument(
        "--arms", nargs="+", choices=ARMS, default=list(ARMS), help="arms to run (default: all)"
    )


def _time_us(fn: Any, tensor: Any, warmup: int, iterations: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        fn(tensor)
    # f and t are locals of timeit's inner loop: the loop adds one local call
    timer = timeit.Timer("f(t)", setup="f = _f; t = _t", globals={"_f": fn, "_t": tensor})
    return [s * 1e6 / iterations for s in timer.repeat(repeat=repeats, number=iterations)]


def _arms(n: int, selected: list[str]) -> dict[str, Any]:
    import torch

    from b12x.bench.lookup_baselines import DictCommunicator, ScanCommunicator
    from b12x.comm.pcie import PLAIN, DeclaredPlanIndex, Invocation

    invocations = {
        str(r): Invocation(name=str(r), operation=PLAIN, shape=(r, 16), dtype=torch.bfloat16)
        for r in range(1, n + 1)
    }
    plans = {name: object() for name in invocations}
    arms: dict[str, Any] = {}
    if "scan" in selected:
        scan = ScanCommunicator.__new__(ScanCommunicator)
        scan._invocations, scan._plans = invocations, plans
        arms["scan"] = scan._has_plan_for
    if "dict" in selected:
        index = DictCommunicator.__new__(DictCommunicator)
        index._invocations, index._plans = invocations, plans
        index._index_declared_plans()
        arms["dict"] = index._has_plan_for
    if "b12x" in selected:
        arms["b12x"] = DeclaredPlanIndex([(inv, plans[name]) for name, inv in invocations.items()])
        arms["b12x"] = arms["b12x"].has_plan_for
    return arms


def run(args: argparse.Namespace) -> BenchResult:
    import torch

    if args.declarations is None:
        args.declarations = list(FULL_N if args.full else DEFAULT_N)
    counts = [*args.declarations, args.iterations, args.repeats]
    if min(counts) < 1 or args.warmup < 0:
        raise SystemExit("b12x bench lookup: counts must be >= 1 (warmup >= 0)")
    baselines = Path(__file__).with_name("lookup_baselines.py")
    result = BenchResult(
        "lookup",
        {
            "declarations": args.declarations,
            "iterations": args.iterations,
            "repeats": args.repeats,
            "warmup": args.warmup,
            "arms": args.arms,
            "scope": "CPU metadata lookup; no collective or model execution",
            "baselines_sha256": hashlib.sha256(baselines.read_bytes()).hexdigest(),
        },
    )
    for n in args.declarations:
        arms = _arms(n, args.arms)
        for case, rows, expect in (("hit", n, True), ("miss", n + 1, False)):
            tensor = torch.empty((rows, 16), dtype=torch.bfloat16)
            for arm, fn in arms.items():
                got = fn(tensor)
                if got is not expect:
                    raise AssertionError(f"{arm} arm: has_plan_for({case}) returned {got!r}")
                samples = _time_us(fn, tensor, args.warmup, args.iterations, args.repeats)
                result.add(case, arm, samples, declarations=n)
                median = result.results[-1]["median_us"]
                print(f"  N={n} {case} {arm}: {median:.3f} us", file=sys.stderr, flush=True)
    result.notes.extend(_verdicts(result, args.declarations))
    return result


def _verdicts(result: BenchResult, declarations: list[int]) -> list[str]:
    """One line per DESIGN.md §5 target the run can judge."""
    med = {(r["case"], r["arm"], r["declarations"]): r["median_us"] for r in result.results}
    notes = []

    def verdict(ok: bool) -> str:
        return "PASS" if ok else "MISS"

    for case in ("hit", "miss"):
        b12x = [med[(case, "b12x", n)] for n in declarations if (case, "b12x", n) in med]
        if len(b12x) > 1:
            spread = max(b12x) / min(b12x)
            notes.append(
                f"{case}: b12x max/min over N = {spread:.2f} "
                f"(target <= {FLAT_MAX_OVER_MIN}) {verdict(spread <= FLAT_MAX_OVER_MIN)}"
            )
        for n in declarations:
            if (case, "b12x", n) not in med:
                continue
            b = med[(case, "b12x", n)]
            if (case, "dict", n) in med:
                ratio = b / med[(case, "dict", n)]
                notes.append(
                    f"{case} N={n}: b12x/dict = {ratio:.3f} "
                    f"(target <= {MAX_FRACTION_OF_DICT}) {verdict(ratio <= MAX_FRACTION_OF_DICT)}"
                )
            if (case, "scan", n) in med:
                speedup = med[(case, "scan", n)] / b
                line = f"{case} N={n}: scan/b12x = {speedup:.0f}x"
                if n == SCAN_TARGET_DECLARATIONS:
                    ok = speedup >= MIN_SPEEDUP_OVER_SCAN
                    line += f" (target >= {MIN_SPEEDUP_OVER_SCAN:.0f}x) {verdict(ok)}"
                notes.append(line)
    return notes
