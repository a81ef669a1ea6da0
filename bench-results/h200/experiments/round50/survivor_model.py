"""How many keys a scorer-side running threshold would let through to the
selection, on rows drawn like `b12x bench indexer`'s inputs (the same draw as
round 49's bin_sizes.py), on the CPU.

The idea under test: each decode scorer CTA keeps a lower bound on its row's
k-th key while it streams pages, and hands the selection only the keys at or
above the bound at the time it scored them. A bound is only safe once k keys
above it have been seen, so a CTA's bound is the k-th key of what it has
scored so far, cut to the top `bits` bits of the key (a histogram's bin
edge), refreshed every `every` pages. With `shared`, the row's CTAs also take
the highest bound any of them has published. The row is split into `segs`
contiguous segments scored in step, one page (64 tokens) each at a time:
decode_r64 is about 4 CTAs a row, decode_r1 64.

Prints, per setting, the keys let through in three rows.
Run: .venv/bin/python THIS_FILE"""

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "round49"))
from bin_sizes import row_keys  # the same draw as round 49's

PAGE = 64


def let_through(key, k, segs, every, bits, shared):
    seg_len = len(key) // segs
    seen = [[] for _ in range(segs)]
    bound = [0] * segs
    row_bound = 0
    passed = 0
    cut = 32 - bits
    for page in range(seg_len // PAGE):
        for s in range(segs):
            start = s * seg_len + page * PAGE
            keys = key[start : start + PAGE]
            floor = max(bound[s], row_bound) if shared else bound[s]
            passed += int((keys >= floor).sum())
            seen[s].append(keys)
            if (page + 1) % every == 0:
                scored = np.concatenate(seen[s])
                if len(scored) >= k:
                    kth = np.sort(scored)[::-1][k - 1]
                    bound[s] = max(bound[s], (kth >> cut) << cut)
                    row_bound = max(row_bound, bound[s])
    return passed


torch.manual_seed(0)
for length, k, segs in ((32768, 512, 4), (131072, 512, 64)):
    for bits in (11, 16):
        for every in (1, 16):
            for shared in (False, True):
                got = [
                    let_through(row_keys(length), k, segs, every, bits, shared) for _ in range(3)
                ]
                print(
                    f"L={length} k={k} segs={segs} bits={bits} every={every} shared={shared}: {got}"
                )
