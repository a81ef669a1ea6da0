"""How many keys the stream top-k keeps a row, under bounds of different grain.

The stream top-k (kernels/indexer_topk.cu, `topk_stream`) reads a row in
rounds, keeps every key at or above its running bound, and raises the bound
between rounds. The bound is a histogram bin's floor (the key's top 12 bits).
This replays that rule in numpy on rows drawn like the bench's prefill
inputs (`b12x.bench.indexer.make_inputs`: FP8 q and K, random head weights
and per-token scales), with the first round's bound cut to a finer grain or
every bound exact, to size what a finer bound could save. CPU only:

    python tools/keep_bound_sim.py [--rows 6] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

HEADS, DIM, LENGTH, TOPK = 64, 128, 32768, 512
ROUND = 512 * 4 * 4  # threads x float4 groups a thread x 4 keys: one round of the kernel


def order_keys(logits: np.ndarray) -> np.ndarray:
    """Order-preserving unsigned keys of float32 values (as the kernel's value key)."""
    b = logits.view(np.uint32).astype(np.uint64)
    return np.where(b >> 31 == 1, ~b & 0xFFFFFFFF, b | 0x80000000)


def bound(keys: np.ndarray, bits: int) -> int:
    """The floor of the `bits`-bit key prefix that holds the TOPK-th largest key."""
    kth = int(np.partition(keys, len(keys) - TOPK)[len(keys) - TOPK])
    shift = 32 - bits
    return kth >> shift << shift


def kept(keys: np.ndarray, first_bits: int, raise_bits: int) -> list[int]:
    """Keys kept in each round: the first round against its own bound of
    `first_bits`, later rounds against the bound raised (at `raise_bits`) from
    every key seen so far."""
    per_round, b = [], 0
    for r in range(len(keys) // ROUND):
        chunk = keys[r * ROUND : (r + 1) * ROUND]
        if r == 0:
            b = bound(chunk, first_bits)
        per_round.append(int((chunk >= b).sum()))
        b = max(b, bound(keys[: (r + 1) * ROUND], raise_bits))
    return per_round


def row_logits(g: torch.Generator) -> np.ndarray:
    q = (torch.randn(HEADS, DIM, generator=g) * 2).to(torch.float8_e4m3fn).float()
    w = torch.randn(HEADS, generator=g) * HEADS**-0.5
    k = (torch.randn(LENGTH, DIM, generator=g) * 2).to(torch.float8_e4m3fn).float()
    scale = torch.rand(LENGTH, generator=g) + 0.05
    return ((torch.relu(q @ k.T) * w[:, None]).sum(0) * scale).numpy().astype(np.float32)


RULES = {
    "bin floor (the kernel)": (12, 12),
    "first bound to 20 bits, later raises by bin": (20, 12),
    "exact at every round": (32, 32),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=6)
    ap.add_argument("--json", help="write every row's per-round counts here")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(0)
    out: dict[str, list[list[int]]] = {name: [] for name in RULES}
    for _ in range(args.rows):
        keys = order_keys(row_logits(g))
        for name, (first, later) in RULES.items():
            out[name].append(kept(keys, first, later))
    for name, rows in out.items():
        totals = [sum(r) for r in rows]
        print(f"{name:45s} mean {np.mean(totals):7.1f}  rows {totals}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"topk": TOPK, "round": ROUND, "length": LENGTH, "kept": out}, f, indent=1)


if __name__ == "__main__":
    main()
