"""One eager indexer call per benchmark case, for ncu: every kernel of the call runs once.

ncu --clock-control none --kernel-name regex:b12x_indexer python3 tools/gpu/indexer_profile.py [case ...]
"""

from __future__ import annotations

import sys

import torch
from b12x.attention import dsa_indexer as di
from b12x.bench.indexer import CASES, DEFAULT_CASES, make_inputs


def run_once(name: str) -> None:
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
    print(f"{name}: supertile {plan.supertile_tokens}, slices {plan.topk_slices}")


if __name__ == "__main__":
    for name in sys.argv[1:] or DEFAULT_CASES:
        run_once(name)
