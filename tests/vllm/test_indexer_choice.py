"""Never slower for a vLLM user (issue 19, item 3): the per-(architecture, mode)
choice between b12x's indexer and stock vLLM's, from the committed figures.

The stock figures of issue 19's table (98.2 / 25.9 / 2540 us, DeepGEMM logits
+ vLLM's top-k on one H200) stand in for the ``stock_vllm`` rows the committed
bench file does not have yet."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from b12x.integration.vllm import indexer_choice as ic
from b12x.integration.vllm.indexer import PRECISION

ROOT = Path(__file__).resolve().parents[2]
H200, ADA, B200, RTX_PRO = (9, 0), (8, 9), (10, 0), (12, 0)
STOCK_US = {"decode_r64_L32768": 98.2, "decode_r1_L131072": 25.9, "prefill_r4096_L32768": 2540.0}


def committed_bench():
    return json.loads((ROOT / ic.SOURCES["sm_90"]).read_text())


def with_stock(bench, stock=STOCK_US):
    bench = copy.deepcopy(bench)
    for case, us in stock.items():
        bench["results"].append({"case": case, "arm": "stock_vllm", "median_us": us})
    return bench


def table_of(bench):
    return {"sm_90": ic.build_table(bench, "sm_90")}


def test_the_package_table_agrees_with_the_committed_bench_results():
    assert ic.table_text(ROOT) == (ROOT / ic.TABLE_PATH).read_text()
    assert ic.load_table() == json.loads((ROOT / ic.TABLE_PATH).read_text())
    modes = ic.load_table()["sm_90"]["modes"]
    assert set(modes) == {"decode", "prefill"}
    assert set(modes["decode"]) == {"decode_r64_L32768", "decode_r1_L131072"}


def test_without_stock_figures_vllms_own_path_is_kept_where_it_has_deepgemm():
    choice = ic.choose(H200, PRECISION)  # the committed file: no stock_vllm rows yet
    assert {m: c.b12x for m, c in choice.items()} == {"decode": False, "prefill": False}
    assert choice["decode"].why == "no b12x vs stock vLLM figures for decode on sm_90"
    reason = ic.layer_reason(H200, PRECISION)
    assert reason.startswith("no b12x vs stock vLLM figures for decode on sm_90; no b12x vs")


def test_with_issue_19s_stock_figures_b12x_loses_both_modes_on_the_h200():
    table = table_of(with_stock(committed_bench()))
    choice = ic.choose(H200, "exact", table)
    assert not choice["decode"].b12x and not choice["prefill"].b12x
    assert "decode_r64_L32768: b12x 115.4 us vs vLLM 98.2 us" in choice["decode"].why
    assert "prefill_r4096_L32768: b12x 4343.8 us vs vLLM 2540.0 us" in choice["prefill"].why
    assert "(one layer serves both modes)" in ic.layer_reason(H200, "exact", table)


def test_a_mode_is_b12xs_only_when_every_case_of_it_wins():
    stock = {"decode_r64_L32768": 120.0, "decode_r1_L131072": 40.0, "prefill_r4096_L32768": 9e3}
    table = table_of(with_stock(committed_bench(), stock))
    choice = ic.choose(H200, "exact", table)
    assert not choice["decode"].b12x  # 40.8 > 40.0 on one case is enough to lose
    assert choice["prefill"].b12x and "at least as fast" in choice["prefill"].why
    stock["decode_r1_L131072"] = 40.832  # a tie is "at least as fast"
    table = table_of(with_stock(committed_bench(), stock))
    assert ic.layer_reason(H200, "exact", table) is None


def test_the_rule_compares_the_precision_the_adapter_plans_with():
    stock = {"decode_r64_L32768": 113.0, "decode_r1_L131072": 40.0, "prefill_r4096_L32768": 3600.0}
    table = table_of(with_stock(committed_bench(), stock))
    assert ic.layer_reason(H200, "fast", table) is None  # fast: 112.0 / 39.9 / 3508.9
    assert ic.layer_reason(H200, "exact", table) is not None  # exact: 115.4 / 40.8 / 4343.8
    assert PRECISION == "exact"


ARCHES = [(ADA, False), ((8, 6), False), (H200, True), (B200, True), ((10, 3), True),
          (RTX_PRO, True), ((12, 1), True)]  # fmt: skip


@pytest.mark.parametrize(("capability", "deepgemm"), ARCHES)
def test_where_vllm_has_no_deepgemm_b12x_is_used(capability, deepgemm):
    assert ic.vllm_has_deepgemm(capability) is deepgemm
    choice = ic.choose(capability, PRECISION)
    assert all(c.b12x for c in choice.values()) is (not deepgemm)
    if not deepgemm:
        assert ic.layer_reason(capability, PRECISION) is None
        assert "no DeepGEMM fast path on" in choice["decode"].why
    elif capability != H200:  # vLLM has DeepGEMM there and there are no figures
        assert "no b12x vs stock vLLM figures" in ic.layer_reason(capability, PRECISION)


def test_absent_figures_never_count_as_a_win():
    bench = committed_bench()
    bench["results"] = [r for r in bench["results"] if not r["case"].startswith("prefill")]
    table = table_of(with_stock(bench, {"decode_r64_L32768": 500, "decode_r1_L131072": 500}))
    choice = ic.choose(H200, "exact", table)
    assert choice["decode"].b12x and not choice["prefill"].b12x
