"""One eager indexer call per benchmark case, for ncu: every kernel of the call runs once.

ncu --clock-control none --kernel-name regex:b12x_indexer \
    python3 tools/gpu/indexer_profile.py [--precision exact|fast] [case ...]
"""

from __future__ import annotations

import argparse

import torch
from b12x.attention import dsa_indexer as di
from b12x.bench.indexer import CASES, DEFAULT_CASES, bind_case, case_caps, make_inputs


def case_binding(name: str, precision: str):
    """A plan of bench case ``name`` bound over the bench's inputs, with its own
    scratch and indices; the plan is ``binding.plan``."""
    case = CASES[name]
    plan = di.plan(case_caps(case, precision))
    return bind_case(
        plan,
        make_inputs(case),
        torch.empty((plan.nbytes,), dtype=torch.uint8, device="cuda"),
        torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda"),
    )


def run_once(name: str, precision: str) -> None:
    binding = case_binding(name, precision)
    plan = binding.plan
    di.run(binding)
    torch.cuda.synchronize()
    print(f"{name} ({precision}): supertile {plan.supertile_tokens}, slices {plan.topk_slices}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=("exact", "fast"), default="exact")
    ap.add_argument("cases", nargs="*", choices=sorted(CASES), metavar="case")
    args = ap.parse_args()
    for name in args.cases or DEFAULT_CASES:
        run_once(name, args.precision)
