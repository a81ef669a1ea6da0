"""A small indexer case for `compute-sanitizer --tool memcheck` (not a pytest module).

    compute-sanitizer --tool memcheck python tests/indexer_memcheck_case.py

Runs decode (one and several chunks, two-stage top-k, physical output, an
unmapped page, a partial last page, len 0) and shared-table prefill once each.
"""

from __future__ import annotations

import torch
from b12x import _indexer_raw, cuda


def main() -> None:
    torch.manual_seed(0)
    dev = "cuda"
    cuda.load_kernels(0)
    rows, heads, width, topk = 3, 48, 20, 512
    q = torch.randn(rows, heads, 128, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, device=dev)
    pages = rows * width
    kcache = torch.randint(0, 100, (pages, 8448 + 16), dtype=torch.uint8, device=dev)[:, :8448]
    kcache[:, 8192:8448] = torch.rand(pages, 64, device=dev).view(torch.uint8).reshape(pages, 256)
    table = torch.randperm(pages, device=dev).int().reshape(rows, width)
    table[1, 3] = -1
    lengths = torch.tensor([width * 64 - 5, 700, 0], dtype=torch.int32, device=dev)
    aw = lengths.max().reshape(1)
    idx = torch.empty(rows, topk, dtype=torch.int32, device=dev)
    sc = torch.empty(rows, topk, device=dev)
    for supertile, slices, physical in [(1536, 1, False), (512, 1, True), (1536, 3, False)]:
        plan = _indexer_raw.RawPlan(rows, heads, width, topk, supertile, slices, False, physical)
        scratch = torch.empty(plan.scratch_bytes, dtype=torch.uint8, device=dev)
        _indexer_raw.launch(plan, scratch, q, w, kcache, table, lengths, aw, idx, sc)
    shared = table[:1].clone()
    shared[0, 3] = table[0, 3]
    plan = _indexer_raw.RawPlan(rows, heads, width, topk, 512, 1, True, False)
    scratch = torch.empty(plan.scratch_bytes, dtype=torch.uint8, device=dev)
    _indexer_raw.launch(
        plan, scratch, q, w, kcache, shared.expand(rows, width), lengths, aw, idx, sc
    )
    torch.cuda.synchronize()
    print("memcheck case done:", int((idx >= 0).sum()), "indices")


if __name__ == "__main__":
    main()
