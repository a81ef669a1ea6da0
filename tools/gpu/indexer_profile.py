"""One eager indexer call per benchmark case, for ncu: every kernel of the call runs once.

ncu --clock-control none --kernel-name regex:b12x_indexer \
    python3 tools/gpu/indexer_profile.py [--precision exact|fast] [case ...]
"""

from __future__ import annotations

import argparse

import torch
from b12x.attention import dsa_indexer as di
from b12x.bench.indexer import CASES, DEFAULT_CASES, make_inputs


def run_once(name: str, precision: str) -> None:
    case = CASES[name]
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
