"""Never slower for a vLLM user (issue 19, item 3): the speed rule on each
committed bench file of sm_90 (the H200's and the H100's), with its own
``stock_vllm`` rows (stock vLLM measured in the same run) or with other stock
figures put in their place.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from b12x.integration.vllm import speed_rule

ROOT = Path(__file__).resolve().parents[2]
HOPPER = (9, 0)
BENCHES = speed_rule.BENCH_FILES["sm_90"]
CASES = ("decode_r64_L32768", "decode_r1_L131072", "prefill_r4096_L32768")


def committed(bench):
    return json.loads((ROOT / bench).read_text())


def committed_us(bench, case, arm):
    rows = committed(bench)["results"]
    return next(r["median_us"] for r in rows if r["case"] == case and r["arm"] == arm)


def stock_us(bench):
    return {case: committed_us(bench, case, speed_rule.STOCK_ARM) for case in CASES}


def committed_with_stock(bench, stock=None, keep=lambda case: True):
    """The committed bench with `stock` as its stock rows (its own replaced),
    as sm_90's only table."""
    run = copy.deepcopy(committed(bench))
    run["results"] = [
        r for r in run["results"] if keep(r["case"]) and r["arm"] != speed_rule.STOCK_ARM
    ]
    stock = stock_us(bench) if stock is None else stock
    run["results"] += [{"case": c, "arm": "stock_vllm", "median_us": us} for c, us in stock.items()]
    return {"sm_90": [speed_rule.figures_from_bench(run, bench)]}


@pytest.mark.parametrize("bench", BENCHES)
def test_with_the_committed_stock_figures_the_rule_follows_every_case_and_says_why(bench):
    device = committed(bench)["meta"]["device"]
    figures = committed_with_stock(bench)
    for precision in ("exact", "fast"):
        d = speed_rule.decide(HOPPER, precision, True, figures)
        arm = speed_rule.ARMS[precision]
        stock = stock_us(bench)
        slower = [c for c, us in stock.items() if committed_us(bench, c, arm) > us]
        assert d.use_b12x is not slower, (precision, d.reason)
        for case, us in stock.items():
            ours = committed_us(bench, case, arm)
            assert (f"{case}: b12x {ours:.1f} us, stock {us:.1f} us" in d.reason) is (ours > us)
        if slower:
            assert f"({precision} precision): {device}, {bench}: " in d.reason
        else:
            assert "at least as fast as stock vLLM on sm_90 in every case" in d.reason
            assert f"({device}, {bench})" in d.reason


@pytest.mark.parametrize("bench", BENCHES)
def test_b12x_serves_where_every_committed_case_is_at_least_as_fast_as_stock(bench):
    generous = {case: committed_us(bench, case, "b12x") for case in CASES}  # ties
    d = speed_rule.decide(HOPPER, "exact", True, committed_with_stock(bench, generous))
    assert d.use_b12x and "at least as fast as stock vLLM on sm_90 in every case" in d.reason


@pytest.mark.parametrize("bench", BENCHES)
def test_a_mode_without_figures_never_counts_as_a_win(bench):
    # decode measured and won; no prefill case at all: prefill is not shown
    decode_only = {c: 1e6 for c in CASES if c.startswith("decode")}
    figures = committed_with_stock(bench, decode_only, keep=lambda case: case.startswith("decode"))
    d = speed_rule.decide(HOPPER, "exact", True, figures)
    assert not d.use_b12x and "prefill: no figures" in d.reason
    assert "decode_" not in d.reason
