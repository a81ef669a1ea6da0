"""How many keys share the k-th key's top 11 bits (the grid and cluster
selections' first digit) on rows drawn like `b12x bench indexer`'s inputs
(b12x.bench.indexer.make_inputs: q, k ~ 2 N(0,1) in FP8, weights N(0,1/heads),
scales U(0.05, 1.05)), on the CPU. Prints, per (row length, K), four rows'
(candidates in the bin, keys above it). Run: .venv/bin/python THIS_FILE"""

import numpy as np
import torch

torch.manual_seed(0)


def bin_of_kth(length, k, heads=64):
    q = (torch.randn(heads, 128) * 2).to(torch.float8_e4m3fn).float()
    w = torch.randn(heads) * heads**-0.5
    keys = (torch.randn(length, 128) * 2).to(torch.float8_e4m3fn).float()
    scales = torch.rand(length) + 0.05
    logits = (torch.relu(keys @ q.T) * w).sum(1) * scales
    b = logits.numpy().view(np.uint32).astype(np.uint64)
    key = np.where(b & 0x80000000, (~b) & 0xFFFFFFFF, b | 0x80000000)  # sel_key, no NaN / -0 here
    digit = key >> 21
    kth = np.sort(key)[::-1][k - 1] >> 21
    return int((digit == kth).sum()), int((digit > kth).sum())


for length in (32768, 131072):
    for k in (512, 2048):
        print(length, k, [bin_of_kth(length, k) for _ in range(4)])
