"""Eager calls of one indexer case, L2 flushed before each, for trace builds.

A diagnostic branch that prints from its kernels (globaltimer stamps by
`printf`) needs a few calls on a cold L2 and nothing else between them:

    python3 tools/gpu/trace_call.py decode_r1_L131072 --precision fast --calls 4

Each call's device output follows its `== call N` line.
"""

from __future__ import annotations

import argparse

import torch
from b12x.attention import dsa_indexer as di
from b12x.bench.common import l2_flusher
from b12x.bench.indexer import CASES
from indexer_profile import case_binding


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--precision", choices=("exact", "fast"), default="fast")
    ap.add_argument("--calls", type=int, default=4)
    args = ap.parse_args()
    binding = case_binding(args.case, args.precision)
    flush = l2_flusher(torch.cuda.current_device())
    for i in range(args.calls):
        flush()
        torch.cuda.synchronize()
        print(f"== call {i}", flush=True)
        di.run(binding)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
