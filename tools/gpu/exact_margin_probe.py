"""How far the fast scorer's logits sit from the exact ones, and how many keys
a row would have to score again exactly if the exact top-k came from the
fast logits plus a margin.

    python3 tools/gpu/exact_margin_probe.py [OUT.json] [--cases ...] [--rows N]
    python3 tools/gpu/exact_margin_probe.py --model [--cases ...] [--rows N]

The question behind it (issue 19, exact prefill over its 3000 us target
while its f16 scorer alone takes about 3027 us): could `precision="exact"`
score with FP8 wgmma, keep every key that the fast logits cannot rule out,
and score only those again exactly? That is sound only if the fast error of
key t has a bound the kernels can compute. Two candidate bounds:

    A(r, t) = scale_t * sum_h |w_rh| * sum_d |q_rhd| * |k_td|
    S(r, t) = scale_t * sum_h |w_rh| * sum_s max_d |q_rhd| * max_d |k_td|

(S: over each 32-deep k-step s of the dot, d in s). A kept set is every key
whose fast logit plus its margin reaches the k-th largest of (fast -
margin). On a GPU the probe runs the bench's own inputs (`b12x bench
indexer`'s make_inputs) through score-only plans of both precisions,
measures the fast error against A and S, and counts the keys kept for
margins at multiples of the largest error seen and at the model's margins
(below). With --model (no GPU) it draws the same inputs on the CPU, takes
the float32 reference as the fast logits (the fast error is far below the
model's margins) and counts the keys kept for the model's margins only.
Nothing here times anything. Rows are sampled evenly (all of a decode case).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference
from b12x.bench import indexer as bi
from b12x.bench import indexer_peers as peers

MULTIPLES = (1, 2, 4, 8, 16, 64)
STEPS = 4  # k-steps of 32 dims in a 128-deep FP8 wgmma dot
# The public model of Hopper's FP8 MMA accumulation (DeepSeek-V3's report,
# SageAttention's FP22 finding): products aligned to the largest exponent of
# the step's 32 products and its accumulator, 14 bits kept, the rest
# truncated. Each of a 128-deep dot's 4 steps then loses under 33 terms of
# 2^-12 of at most A: margin 4 * 33 * 2^-12 * A, if the model holds (it is a
# model, not a documented guarantee). Were each step's accumulator zeroed
# (its sum promoted to fp32 on the CUDA cores), the loss would be relative
# to the step's largest product instead: margins 2^-e * S.
MODEL_MARGINS = (
    ("model", "a", 4 * 33 * 2.0**-12),
    ("step 2^-6", "step", 2.0**-6),
    ("step 2^-8", "step", 2.0**-8),
    ("step 2^-10", "step", 2.0**-10),
)


def kept_mask(logits: torch.Tensor, margin: torch.Tensor, k: int) -> torch.Tensor:
    """The keys that could be among the k best exact ones, given logits off
    by at most ``margin`` each."""
    low = torch.topk(logits - margin, k).values[-1]
    return logits + margin >= low


def bounds(
    inputs: tuple[torch.Tensor, ...], row: int, table_row: int, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A(row, t) and S(row, t) for the row's first n positions, in fp32
    (|e4m3| values and their products are exact there)."""
    q, w, kcache, table, _lengths, _aw = inputs
    k_fp8, scales = reference.unpack_index_k_cache(kcache[table[table_row].long()])
    k = k_fp8.float().reshape(-1, k_fp8.shape[-1])[:n].abs()
    scale = scales.reshape(-1)[:n]
    qa, wa = q[row].float().abs(), w[row].abs()  # [heads, 128], [heads]
    a = (wa[:, None] * torch.matmul(qa, k.t())).sum(0) * scale
    qmax = qa.reshape(qa.shape[0], STEPS, -1).amax(-1)  # [heads, steps]
    kmax = k.reshape(n, STEPS, -1).amax(-1)  # [n, steps]
    step = torch.einsum("h,hs,ts->t", wa, qmax, kmax) * scale
    return a, step


def logits_of(case: bi.Case, inputs: tuple[torch.Tensor, ...], precision: str) -> torch.Tensor:
    """A score-only plan's logits of every row."""
    plan = _core.indexer_build_plan(bi.case_caps(case, precision), score_only=True)
    scratch = torch.empty((plan.nbytes,), dtype=torch.uint8, device="cuda")
    idx = torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda")
    binding = bi.bind_case(plan, inputs, scratch, idx)
    di.run(binding)
    torch.cuda.synchronize()
    logits: torch.Tensor = di.scratch_views(binding)["logits"][: case.rows, : case.context]
    return logits.clone()


def summary(counts: list[int], rho: float) -> dict[str, Any]:
    counts = sorted(counts)
    return {"rho": rho, "median": counts[len(counts) // 2], "max": counts[-1]}


def probe_case(case: bi.Case, sample: int, model: bool) -> dict[str, Any]:
    """The case's error ratios (GPU) and keys kept a row for each margin."""
    inputs = bi.make_inputs(case, device="cpu" if model else "cuda")
    rows = peers.check_rows(case.rows, sample)
    lengths = case.lengths()
    if model:
        ref, _ = peers.reference_logits(inputs, rows)
        exact_of = fast_of = {r: ref[i] for i, r in enumerate(rows)}
    else:
        exact_all, fast_all = logits_of(case, inputs, "exact"), logits_of(case, inputs, "fast")
        exact_of = {r: exact_all[r] for r in rows}
        fast_of = {r: fast_all[r] for r in rows}
    per_row: list[dict[str, Any]] = []  # the JSON's rows
    held: list[tuple[torch.Tensor, dict[str, torch.Tensor], int]] = []  # (fast, bounds, k) a row
    for r in rows:
        n = lengths[r]
        k = min(case.topk, n)
        e, f = exact_of[r][:n].double(), fast_of[r][:n].double()
        a, step = (b.double() for b in bounds(inputs, r, 0 if case.prefill else r, n))
        kth = torch.topk(e, k).values[-1].item()
        row: dict[str, Any] = {"row": r, "n": n, "kth_exact": kth, "median_a": a.median().item()}
        if not model:  # the model's "fast" logits are the reference: no error to measure
            err = (f - e).abs()
            row["max_err_over_a"] = (err / a.clamp_min(1e-30)).max().item()
            row["max_err_over_step"] = (err / step.clamp_min(1e-30)).max().item()
            row["max_err_over_kth"] = err.max().item() / max(abs(kth), 1e-30)
        per_row.append(row)
        held.append((f, {"a": a, "step": step}, k))
    margins = list(MODEL_MARGINS)
    if not model:
        seen = max(p["max_err_over_a"] for p in per_row)
        margins = [(f"{m}x", "a", m * seen) for m in MULTIPLES] + margins
    kept = {
        name: summary([int(kept_mask(f, rho * b[bound], k).sum()) for f, b, k in held], rho)
        for name, bound, rho in margins
    }
    out: dict[str, Any] = {"case": case.name, "rows_sampled": len(rows), "topk": case.topk}
    if not model:
        for key in ("max_err_over_a", "max_err_over_step", "max_err_over_kth"):
            out[key] = max(p[key] for p in per_row)
    return {**out, "kept_keys_per_row": kept, "rows": per_row}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="exact_margin.json")
    p.add_argument("--cases", nargs="+", default=bi.DEFAULT_CASES, choices=sorted(bi.CASES))
    p.add_argument("--rows", type=int, default=64, help="rows sampled a case (at least 2)")
    p.add_argument("--model", action="store_true", help="the model's margins on the CPU")
    args = p.parse_args(argv)
    results = [probe_case(bi.CASES[c], max(2, args.rows), args.model) for c in args.cases]
    for res in results:
        line = f"{res['case']} ({res['rows_sampled']} rows)"
        if not args.model:
            line += (
                f": max |fast-exact| / A = {res['max_err_over_a']:.3e}, "
                f"/ S = {res['max_err_over_step']:.3e}, / |k-th| = {res['max_err_over_kth']:.3e}"
            )
        print(line)
        for name, kept in res["kept_keys_per_row"].items():
            print(
                f"  margin {name:>10} (rho {kept['rho']:.2e}): keys kept a row median "
                f"{kept['median']}, max {kept['max']} (top-k {res['topk']})"
            )
    device = "cpu (model)" if args.model else torch.cuda.get_device_name()
    with open(args.out, "w") as fh:
        json.dump({"device": device, "cases": results}, fh, indent=1)
    ok = args.model or all(math.isfinite(r["max_err_over_a"]) for r in results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
