"""The vLLM plugin uses b12x's indexer only where it is not slower than stock vLLM.

``speed_rule.decide`` on synthetic figures, the committed figures against the
committed benchmark they come from, and the hooks declining (logged once, with
the figures) on a Hopper GPU where the committed benchmark does not show b12x
at least as fast, against the real vLLM 0.33.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import indexer_support as s
import pytest
from b12x.integration.vllm import _once, indexer_hooks, speed_rule
from vllm.utils.import_utils import has_deep_gemm

ROOT = Path(__file__).resolve().parents[2]
HOPPER = (9, 0)


def gpu(device="NVIDIA H200", **cases):
    """One GPU model's figures: case -> (mode, exact, fast, stock)."""
    return {
        "source": f"bench-results/{device.split()[1].lower()}/indexer.json",
        "device": device,
        "timestamp": "t",
        "cases": {
            name: {"mode": m, "exact_us": e, "fast_us": f, "stock_us": st}
            for name, (m, e, f, st) in cases.items()
        },
    }


def table(**cases):
    """Figures of one architecture benchmarked on one GPU model (an H200)."""
    return {"sm_90": [gpu(**cases)]}


FASTER = table(decode_a=("decode", 80.0, 70.0, 98.2), prefill_b=("prefill", 2400.0, 1900.0, 2540.0))


def test_b12x_serves_where_stock_vllm_has_no_fast_indexer():
    # no DeepGEMM, or an architecture vLLM runs none on (Ada)
    for cc, deepgemm in [(HOPPER, False), ((8, 9), True), ((8, 9), False)]:
        d = speed_rule.decide(cc, "exact", deepgemm, FASTER)
        assert d.use_b12x and "stock vLLM has no fast indexer here" in d.reason


def test_b12x_serves_only_where_every_case_is_at_least_as_fast():
    assert speed_rule.decide(HOPPER, "exact", True, FASTER).use_b12x
    tie = table(
        decode_a=("decode", 98.2, 90.0, 98.2), prefill_b=("prefill", 2540.0, 1900.0, 2540.0)
    )
    assert speed_rule.decide(HOPPER, "exact", True, tie).use_b12x  # as fast counts
    one_slower = table(
        decode_a=("decode", 80.0, 70.0, 98.2), prefill_b=("prefill", 4345.7, 1900.0, 2540.0)
    )
    d = speed_rule.decide(HOPPER, "exact", True, one_slower)
    assert not d.use_b12x
    assert "prefill_b: b12x 4345.7 us, stock 2540.0 us" in d.reason
    assert "decode_a" not in d.reason and "exact precision" in d.reason
    # the precision the plugin plans with picks the arm
    assert speed_rule.decide(HOPPER, "fast", True, one_slower).use_b12x


def test_every_benchmarked_gpu_of_the_architecture_must_show_b12x_at_least_as_fast():
    h200 = gpu(decode_a=("decode", 80.0, 70.0, 98.2), prefill_b=("prefill", 2400.0, 1900.0, 2540.0))
    h100 = gpu(
        "NVIDIA H100 80GB HBM3",
        decode_a=("decode", 120.0, 110.0, 131.2),
        prefill_b=("prefill", 3300.0, 2600.0, 2519.4),
    )
    # the rule keys on sm_90, so the H100's slower prefill decides for the H200 too
    d = speed_rule.decide(HOPPER, "fast", True, {"sm_90": [h200, h100]})
    assert not d.use_b12x
    assert (
        "NVIDIA H100 80GB HBM3, bench-results/h100/indexer.json: prefill_b: b12x 2600.0 us, "
        "stock 2519.4 us" in d.reason
    )
    assert "NVIDIA H200" not in d.reason and "decode_a" not in d.reason
    # where both show it, b12x serves and the reason names both runs
    d = speed_rule.decide(HOPPER, "exact", True, {"sm_90": [h200, h100]})
    assert not d.use_b12x  # exact: the H100's 3300 against 2519.4
    faster_h100 = gpu(
        "NVIDIA H100 80GB HBM3",
        decode_a=("decode", 120.0, 110.0, 131.2),
        prefill_b=("prefill", 3300.0, 2400.0, 2519.4),
    )
    d = speed_rule.decide(HOPPER, "fast", True, {"sm_90": [h200, faster_h100]})
    assert d.use_b12x
    assert "NVIDIA H200, bench-results/h200/indexer.json; NVIDIA H100 80GB HBM3" in d.reason


def test_a_missing_figure_never_counts_as_a_win():
    no_stock = table(decode_a=("decode", 80.0, 70.0, None))
    d = speed_rule.decide(HOPPER, "exact", True, no_stock)
    assert not d.use_b12x and "decode_a: b12x 80.0 us, stock no figure" in d.reason
    # an architecture with DeepGEMM and no committed benchmark (Blackwell)
    for cc in [(10, 0), (12, 0)]:
        d = speed_rule.decide(cc, "exact", True, FASTER)
        assert not d.use_b12x and "no committed benchmark" in d.reason and "sm_" in d.reason


def test_the_committed_figures_are_the_committed_benchmark():
    want = speed_rule.render_figures(ROOT)
    got = speed_rule.FIGURES_FILE.read_text()
    assert got == want, "run: python -m b12x.integration.vllm.speed_rule (from the repo root)"
    for arch, rels in speed_rule.BENCH_FILES.items():
        tables = json.loads(got)[arch]
        assert [t["source"] for t in tables] == list(rels)
        for rel, t in zip(rels, tables, strict=True):
            bench = json.loads((ROOT / rel).read_text())
            assert t["device"] == bench["meta"]["device"]
            assert set(t["cases"]) == {r["case"] for r in bench["results"]}


def test_on_hopper_the_committed_runs_decide_and_the_reason_names_what_they_compared():
    # the committed H200 and H100 runs, read here directly: b12x at the
    # plugin's precision against stock vLLM, case by case
    arm = speed_rule.ARMS[speed_rule.PLAN_PRECISION]
    slower = []
    for rel in speed_rule.BENCH_FILES["sm_90"]:
        bench = json.loads((ROOT / rel).read_text())
        medians = {(r["case"], r["arm"]): r["median_us"] for r in bench["results"]}
        cases = sorted({case for case, _ in medians})
        slower += [
            (rel, c) for c in cases if medians[(c, arm)] > medians[(c, speed_rule.STOCK_ARM)]
        ]
    d = speed_rule.decide(HOPPER, speed_rule.PLAN_PRECISION, True)
    assert d.use_b12x is (not slower)
    if slower:
        assert all(rel in d.reason and case in d.reason for rel, case in slower)
        assert f"{speed_rule.PLAN_PRECISION} precision" in d.reason
    else:
        assert "at least as fast as stock vLLM on sm_90 in every case" in d.reason
        assert all(rel in d.reason for rel in speed_rule.BENCH_FILES["sm_90"])


def test_stock_fast_path_is_vllms_own_check():
    assert speed_rule.stock_fast_path(inside_vllm=True) is has_deep_gemm()
    # vLLM's wheel ships DeepGEMM in vllm/third_party: found without importing it
    assert speed_rule.stock_fast_path(inside_vllm=False) is True


@pytest.fixture
def hooks(monkeypatch):
    s.use_cpu_kernels(monkeypatch)
    indexer_hooks.uninstall()
    monkeypatch.setattr(_once, "LOGGED", set())
    yield indexer_hooks
    indexer_hooks.uninstall()


SLOWER_PREFILL = table(
    decode_a=("decode", 80.0, 70.0, 98.2), prefill_b=("prefill", 4345.7, 2600.0, 2540.0)
)


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_on_hopper_with_deepgemm_the_hooks_decline_once_with_the_figures(
    hooks, monkeypatch, caplog, precision
):
    # this CPU stands in for the device check's last step: a Hopper GPU where
    # vLLM has DeepGEMM, and figures where b12x's prefill is slower than stock
    monkeypatch.setattr(speed_rule, "stock_fast_path", lambda inside_vllm: True)
    monkeypatch.setattr(speed_rule, "load_figures", lambda: SLOWER_PREFILL)
    monkeypatch.setattr(speed_rule, "PLAN_PRECISION", precision)
    monkeypatch.setattr(hooks, "_device_reason", lambda: hooks._speed_reason(HOPPER))
    with caplog.at_level(logging.INFO, logger="b12x.integration.vllm"):
        assert hooks.install(s.make_config()) is False
        assert hooks.install(s.make_config()) is False
    logged = [r.getMessage() for r in caplog.records if "b12x indexer not used" in r.getMessage()]
    assert len(logged) == 1
    assert "not shown at least as fast as stock vLLM on sm_90" in logged[0]
    ours = SLOWER_PREFILL["sm_90"][0]["cases"]["prefill_b"][f"{precision}_us"]
    assert f"({precision} precision" in logged[0]
    assert f"prefill_b: b12x {ours:.1f} us, stock 2540.0 us" in logged[0]
    assert "vLLM's own indexer runs" in logged[0]
    assert not hooks.installed()


def test_on_hopper_with_deepgemm_the_hooks_follow_the_committed_figures(hooks, monkeypatch):
    monkeypatch.setattr(speed_rule, "stock_fast_path", lambda inside_vllm: True)
    monkeypatch.setattr(hooks, "_device_reason", lambda: hooks._speed_reason(HOPPER))
    rule = speed_rule.decide(HOPPER, speed_rule.PLAN_PRECISION, True)
    assert hooks.install(s.make_config()) is rule.use_b12x
    assert hooks.installed() is rule.use_b12x


def test_without_deepgemm_the_hooks_install_b12x(hooks, monkeypatch):
    monkeypatch.setattr(speed_rule, "stock_fast_path", lambda inside_vllm: False)
    monkeypatch.setattr(hooks, "_device_reason", lambda: hooks._speed_reason(HOPPER))
    assert hooks.install(s.make_config()) is True
    assert hooks.installed()
