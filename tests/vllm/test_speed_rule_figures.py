"""Never slower for a vLLM user (issue 19, item 3): the speed rule on the
committed bench file, with its own ``stock_vllm`` rows (stock vLLM measured in
the same run) or with other stock figures put in their place.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from b12x.integration.vllm import speed_rule

ROOT = Path(__file__).resolve().parents[2]
H200 = (9, 0)
BENCH = speed_rule.BENCH_FILES["sm_90"]
CASES = ("decode_r64_L32768", "decode_r1_L131072", "prefill_r4096_L32768")


def committed_us(case, arm):
    rows = json.loads((ROOT / BENCH).read_text())["results"]
    return next(r["median_us"] for r in rows if r["case"] == case and r["arm"] == arm)


STOCK_US = {case: committed_us(case, speed_rule.STOCK_ARM) for case in CASES}


def committed_with_stock(stock=STOCK_US, keep=lambda case: True):
    """The committed bench with `stock` as its stock rows (its own replaced)."""
    bench = copy.deepcopy(json.loads((ROOT / BENCH).read_text()))
    bench["results"] = [
        r for r in bench["results"] if keep(r["case"]) and r["arm"] != speed_rule.STOCK_ARM
    ]
    bench["results"] += [
        {"case": c, "arm": "stock_vllm", "median_us": us} for c, us in stock.items()
    ]
    return {"sm_90": speed_rule.figures_from_bench(bench, BENCH)}


def test_with_the_committed_stock_figures_the_h200_follows_every_case_and_says_why():
    figures = committed_with_stock()
    for precision in ("exact", "fast"):
        d = speed_rule.decide(H200, precision, True, figures)
        arm = speed_rule.ARMS[precision]
        slower = [c for c, stock in STOCK_US.items() if committed_us(c, arm) > stock]
        assert d.use_b12x is not slower, (precision, d.reason)
        for case, stock in STOCK_US.items():
            ours = committed_us(case, arm)
            assert (f"{case}: b12x {ours:.1f} us, stock {stock:.1f} us" in d.reason) is (
                ours > stock
            )
        if slower:
            assert f"({precision} precision, {BENCH}, NVIDIA H200)" in d.reason
        else:
            assert "at least as fast as stock vLLM on sm_90 in every case" in d.reason


def test_b12x_serves_where_every_committed_case_is_at_least_as_fast_as_stock():
    generous = {case: committed_us(case, "b12x") for case in STOCK_US}  # ties
    d = speed_rule.decide(H200, "exact", True, committed_with_stock(generous))
    assert d.use_b12x and "at least as fast as stock vLLM on sm_90 in every case" in d.reason


def test_a_mode_without_figures_never_counts_as_a_win():
    # decode measured and won; no prefill case at all: prefill is not shown
    decode_only = {c: 1e6 for c in STOCK_US if c.startswith("decode")}
    figures = committed_with_stock(decode_only, keep=lambda case: case.startswith("decode"))
    d = speed_rule.decide(H200, "exact", True, figures)
    assert not d.use_b12x and "prefill: no figures" in d.reason
    assert "decode_" not in d.reason
