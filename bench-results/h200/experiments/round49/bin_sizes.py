"""How many keys share the k-th key's top 11 bits (the grid and cluster
selections' first digit) on rows drawn like `b12x bench indexer`'s inputs
(b12x.bench.indexer.make_inputs: q, k ~ 2 N(0,1) in FP8, weights N(0,1/heads),
scales U(0.05, 1.05)), on the CPU. Prints, per (row length, K), four rows'
(candidates in the bin, keys above it). Run: .venv/bin/python THIS_FILE
(round 50's survivor_model.py draws its rows with row_keys)."""

import numpy as np
import torch


def row_keys(length, heads=64):
    """One row's selection keys (sel_key of its logits; no NaN or -0 here)."""
    q = (torch.randn(heads, 128) * 2).to(torch.float8_e4m3fn).float()
    w = torch.randn(heads) * heads**-0.5
    keys = (torch.randn(length, 128) * 2).to(torch.float8_e4m3fn).float()
    scales = torch.rand(length) + 0.05
    logits = (torch.relu(keys @ q.T) * w).sum(1) * scales
    b = logits.numpy().view(np.uint32).astype(np.uint64)
    return np.where(b & 0x80000000, (~b) & 0xFFFFFFFF, b | 0x80000000)


def bin_of_kth(length, k):
    key = row_keys(length)
    digit = key >> 21
    kth = np.sort(key)[::-1][k - 1] >> 21
    return int((digit == kth).sum()), int((digit > kth).sum())


if __name__ == "__main__":
    torch.manual_seed(0)
    for length in (32768, 131072):
        for k in (512, 2048):
            print(length, k, [bin_of_kth(length, k) for _ in range(4)])
