"""A small indexer case for `compute-sanitizer --tool memcheck` (not a pytest module).

    compute-sanitizer --tool memcheck python tests/indexer/indexer_memcheck_case.py

Runs decode (one and several chunks, two-stage top-k, physical output, an
unmapped page, a partial last page, len 0) and shared-table prefill through
plan / bind / run, each once; then each again with live page ids past the
cache (one past the end and 2^31 - 1), which must be skipped without an
out-of-bounds read and reported by ``Binding.check()``. Each at both
precisions (on Hopper "fast" runs the TMA scorers).
"""

from __future__ import annotations

import torch
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref
from b12x.errors import PageTableError


def case(rows, heads, width, lengths, mode, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    table_rows = 1 if mode == "prefill" else rows
    pages = table_rows * width
    k_fp8, scales = ref.quantize_index_k(torch.randn(pages, 64, 128, device="cuda", generator=g))
    cache = ref.pack_index_k_cache(k_fp8, scales, page_stride=8448 + 16)
    table = torch.randperm(pages, device="cuda", generator=g).int().reshape(table_rows, width)
    table[0, 3] = -1
    if mode == "prefill":
        table = table.expand(rows, width)
    return {
        "q_fp8": torch.randn(rows, heads, 128, device="cuda", generator=g).to(torch.float8_e4m3fn),
        "query_weights": torch.randn(rows, heads, device="cuda", generator=g),
        "index_k_cache": cache,
        "page_table": table,
        "cache_lengths": torch.tensor(lengths, dtype=torch.int32, device="cuda"),
        "active_width": torch.tensor([max(lengths)], dtype=torch.int32, device="cuda"),
    }


def main() -> None:
    rows, heads, width = 3, 48, 300
    for precision, mode, supertile, space in [
        (precision, *shape)
        for precision in ("exact", "fast")
        for shape in [
            ("decode", 0, "logical"),  # one chunk, two-stage top-k
            ("decode", 1536, "physical"),  # several chunks
            ("prefill", 1024, "logical"),
        ]
    ]:
        inputs = case(rows, heads, width, [width * 64 - 5, 700, 0], mode, seed=len(mode))
        plan = di.plan(
            di.Caps(device="cuda", num_q_heads=heads, max_q_rows=rows,
                    max_page_table_width=width, topk=512, mode=mode,
                    output_index_space=space, supertile_tokens=supertile,
                    precision=precision)
        )  # fmt: skip
        out = torch.empty(rows, 512, dtype=torch.int32, device="cuda")
        sc = torch.empty(rows, 512, device="cuda")
        scratch = torch.empty(plan.nbytes, dtype=torch.uint8, device="cuda")
        b = di.bind(plan, scratch=scratch, output_indices=out, output_scores=sc, **inputs)
        di.run(b)
        torch.cuda.synchronize()
        b.check()
        pages = inputs["index_k_cache"].shape[0]
        row0 = inputs["page_table"][:1]  # the shared row of prefill, row 0 of decode
        row0[0, 1] = pages  # one past the end, live
        row0[0, 7] = 2**31 - 1
        di.run(b)
        try:
            b.check()
            raise SystemExit(f"{mode} {precision}: the page ids past the cache were not reported")
        except PageTableError as e:
            reported = str(e)
        print(f"{mode} {precision} ({plan.mma_flavor}) supertile={plan.supertile_tokens} "
              f"slices={plan.topk_slices}: ok; "
              f"{reported[:64]}...")  # fmt: skip


if __name__ == "__main__":
    main()
