"""How many keys the stream top-k keeps a row, under bounds of different grain.

The stream top-k (kernels/indexer_topk.cu, `topk_stream`) reads a row in
rounds, keeps every key at or above its running bound, and raises the bound
between rounds. The bound is a histogram bin's floor (the key's top 12 bits),
first set from the rounds counted in full (two since 10a458c). This replays
that rule in numpy on rows of the bench's prefill case (its own inputs,
`make_inputs` on the CPU, and b12x's float32 reference logits), beside the
rule with one round counted first, a first bound of a finer grain, and every
bound exact, to size what each would save. CPU only:

    python tools/keep_bound_sim.py [--rows 6] [--json OUT]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch
from b12x.attention.dsa_indexer import reference
from b12x.bench.indexer import CASES, make_inputs
from b12x.bench.indexer_peers import check_rows, reference_logits

CASE = CASES["prefill_r4096_L32768"]
# One round of the kernel: TOPK_STREAM_THREADS (512) threads x TOPK_STREAM_UNROLL (4)
# float4 groups a thread x 4 keys (kernels/indexer_topk.cu).
ROUND = 512 * 4 * 4


def bound(keys: np.ndarray, bits: int) -> int:
    """The floor of the `bits`-bit key prefix that holds the top-k-th largest key."""
    kth = int(np.partition(keys, len(keys) - CASE.topk)[len(keys) - CASE.topk])
    shift = 32 - bits
    return kth >> shift << shift


def kept(keys: np.ndarray, first_bits: int, raise_bits: int, first_rounds: int = 1) -> list[int]:
    """Keys kept in each round: the first `first_rounds` rounds, counted in
    full, against their own bound of `first_bits`, later rounds against the
    bound raised (at `raise_bits`) from every key seen so far."""
    per_round, b = [], 0
    head = first_rounds * ROUND
    for start in range(0, len(keys), ROUND):
        chunk = keys[start : start + ROUND]
        if start == 0:
            b = bound(keys[:head], first_bits)
        per_round.append(int((chunk >= b).sum()))
        if start + ROUND >= head:
            b = max(b, bound(keys[: start + ROUND], raise_bits))
    return per_round


RULES = {
    "bin floor, first round counted (before 10a458c)": (12, 12, 1),
    "first bound to 20 bits, later raises by bin": (20, 12, 1),
    "exact at every round": (32, 32, 1),
    "bin floor, first two rounds counted (the kernel)": (12, 12, 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=6, help="rows spread over the case's")
    ap.add_argument("--json", help="write every row's per-round counts here")
    args = ap.parse_args()
    if args.rows < 2:  # check_rows spreads them from the first row to the last
        ap.error(f"--rows: expected at least 2, got {args.rows}")
    rows = check_rows(CASE.rows, args.rows)
    logits, lengths = reference_logits(make_inputs(CASE, device="cpu"), rows)
    cand = torch.arange(logits.shape[1])[None, :] < torch.tensor(lengths)[:, None]
    keys = reference.order_keys(logits, cand).numpy()
    out: dict[str, list[list[int]]] = {name: [] for name in RULES}
    for i, n in enumerate(lengths):
        for name, (first, later, head) in RULES.items():
            out[name].append(kept(keys[i, :n], first, later, head))
    for name, counts in out.items():
        totals = [sum(r) for r in counts]
        print(f"{name:50s} mean {np.mean(totals):7.1f}  rows {totals}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"case": CASE.name, "rows": rows, "round": ROUND, "kept": out}, f, indent=1)


if __name__ == "__main__":
    main()
