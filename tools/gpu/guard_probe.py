"""Does any indexer plan write past its scratch or its outputs? Guard bytes, on a GPU.

    python3 tools/gpu/guard_probe.py [case ...]

For each bench case and each plan the bench runs (exact, fast, score-only
exact and fast, top-k only), the scratch is ``plan.nbytes`` plus a guard of
GUARD bytes, and the outputs are the leading rows of larger tensors, every
spare byte set to a pattern; the call runs three times and the probe reports
every guard byte that changed (none expected), then whether a tensor
allocated after the binding (as the bench's peers do) is left as it was.
Memcheck does not see such writes: they land inside the caching allocator's
segments.
"""

from __future__ import annotations

import argparse

import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.bench.indexer import CASES, DEFAULT_CASES, bind_case, case_caps, make_inputs

GUARD = 64 << 20
PATTERN = 0xA5


def changed(t: torch.Tensor) -> int:
    return int((t.view(torch.uint8) != PATTERN).sum())


def probe(name: str) -> bool:
    case = CASES[name]
    inputs = make_inputs(case)
    plans = {
        "exact": di.plan(case_caps(case, "exact")),
        "fast": di.plan(case_caps(case, "fast")),
        "score_only:exact": _core.indexer_build_plan(case_caps(case, "exact"), score_only=True),
        "score_only:fast": _core.indexer_build_plan(case_caps(case, "fast"), score_only=True),
    }
    ok = True
    exact_scratch = None
    for label, plan in plans.items():
        scratch = torch.full((plan.nbytes + GUARD,), PATTERN, dtype=torch.uint8, device="cuda")
        idx_all = torch.empty((case.rows + 64, case.topk), dtype=torch.int32, device="cuda")
        sc_all = torch.empty((case.rows + 64, case.topk), dtype=torch.float32, device="cuda")
        idx_all.view(torch.uint8).fill_(PATTERN)
        sc_all.view(torch.uint8).fill_(PATTERN)
        binding = bind_case(plan, inputs, scratch, idx_all[: case.rows], sc_all[: case.rows])
        after = torch.full((GUARD,), PATTERN, dtype=torch.uint8, device="cuda")
        for _ in range(3):
            di.run(binding)
        torch.cuda.synchronize()
        bad = {
            "scratch guard": changed(scratch[plan.nbytes :]),
            "indices guard": changed(idx_all[case.rows :]),
            "scores guard": changed(sc_all[case.rows :]),
            "a later tensor": changed(after),
        }
        first = None
        if bad["scratch guard"]:
            off = torch.nonzero(scratch[plan.nbytes :] != PATTERN)[:1]
            first = int(off[0, 0]) if len(off) else None
        print(f"{name} {label}: nbytes {plan.nbytes}, changed {bad}, first past nbytes {first}")
        ok &= not any(bad.values())
        if label == "exact":
            exact_scratch = (scratch, binding)
    # the top-k stage alone on the exact plan's logits, as the bench's topk_only arm
    scratch, binding = exact_scratch
    stage_plan = _core.indexer_build_plan(case_caps(case, "exact"), topk_only=True)
    stage = bind_case(stage_plan, inputs, scratch, binding.output_indices, binding.output_scores)
    before = changed(scratch[plans["exact"].nbytes :])
    di.run(stage)
    torch.cuda.synchronize()
    grown = changed(scratch[plans["exact"].nbytes :]) - before
    print(f"{name} topk_only: nbytes {stage_plan.nbytes}, guard bytes changed {grown}")
    return ok and grown == 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("cases", nargs="*", choices=sorted(CASES), metavar="case")
    args = ap.parse_args()
    results = [probe(n) for n in args.cases or DEFAULT_CASES]
    print("guard probe:", "every guard intact" if all(results) else "GUARD BYTES CHANGED")
    raise SystemExit(0 if all(results) else 1)
