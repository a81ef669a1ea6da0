"""How many keys a prefill row would keep if exact selection came from fast
(FP8 wgmma) logits plus a per-key error margin, on the CPU.

    python3 tools/exact_margin_model.py [--rows N] [--seed S]

Draws rows as `b12x bench indexer` does (64 heads, q and k `randn * 2` in
e4m3, weights `randn / 8`, scales U(0.05, 1.05), 32768 keys, top-512),
computes the exact logits in fp64, and for each margin rho * B counts the
keys whose logit plus its margin reaches the 512th largest of (logit -
margin): the keys an exact re-score would have to see. B is A (scale *
sum_h |w_h| * sum_d |q_hd| |k_d|, what the public model of Hopper's FP8
accumulation loses bits relative to when the accumulator runs through all
four 32-deep steps) or S (scale * sum_h |w_h| * sum_steps max|q| * max|k|,
the same model with each step's accumulator zeroed). Exact logits stand in
for the fast ones: the fast error is far below every margin here.
`tools/gpu/exact_margin_probe.py` measures that error on a GPU.
"""

from __future__ import annotations

import argparse

import torch

HEADS, DIM, KEYS, TOPK, STEPS = 64, 128, 32768, 512, 4
MARGINS = (
    ("A", 1e-4),
    ("A", 1e-3),
    ("A", 4e-3),
    ("A", 4 * 33 * 2.0**-12),
    ("S", 2.0**-6),
    ("S", 2.0**-8),
    ("S", 2.0**-10),
)


def e4m3(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * 2).to(torch.float8_e4m3fn).double()


def kept(logits: torch.Tensor, margin: torch.Tensor) -> int:
    low = torch.topk(logits - margin, TOPK).values[-1]
    return int((logits + margin >= low).sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    g = torch.Generator().manual_seed(args.seed)
    k = e4m3((KEYS, DIM), g)
    scale = torch.rand(KEYS, generator=g, dtype=torch.float64) + 0.05
    kmax = k.abs().reshape(KEYS, STEPS, DIM // STEPS).amax(-1)
    for row in range(args.rows):
        q = e4m3((HEADS, DIM), g)
        w = torch.randn(HEADS, generator=g, dtype=torch.float64) * HEADS**-0.5
        logits = (w[:, None] * (q @ k.t()).clamp_min(0)).sum(0) * scale
        bounds = {
            "A": (w.abs()[:, None] * (q.abs() @ k.abs().t())).sum(0) * scale,
            "S": torch.einsum(
                "h,hs,ts->t", w.abs(), q.abs().reshape(HEADS, STEPS, -1).amax(-1), kmax
            )
            * scale,
        }
        kth = torch.topk(logits, TOPK).values[-1].item()
        counts = ", ".join(f"{b} {rho:.2e}: {kept(logits, rho * bounds[b])}" for b, rho in MARGINS)
        print(
            f"row {row}: k-th logit {kth:.2f}, median A {bounds['A'].median():.0f}; kept {counts}"
        )


if __name__ == "__main__":
    main()
