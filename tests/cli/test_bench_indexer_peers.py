"""The stock vLLM peer of ``b12x bench indexer``, on CPU.

The arms run against CPU stand-ins for DeepGEMM and vLLM's compiled ops
(``stock_vllm_fakes``: the argument contract vLLM documents, asserted, and
the logits computed from the cache bytes), with a timer that returns fixed
samples, so what is checked is the plumbing: the calls as vLLM makes them,
the logits check, which top-k vLLM runs, the stored-figure fallback and its
label, the ratios, and the skip reasons.
"""

from __future__ import annotations

import json
import statistics
from types import SimpleNamespace

import pytest
import torch
from b12x.bench import indexer_peers as peers
from b12x.bench import indexer_stock as stock
from b12x.bench.common import BenchResult, write_report
from b12x.bench.indexer import (
    CASES,
    DEFAULT_CASES,
    Case,
    ScratchGuards,
    bind_case,
    case_caps,
    make_inputs,
)
from stock_vllm_fakes import FakeDeepGemm, FakeVllmOps

DECODE = Case("decode_small", rows=4, context=1024, prefill=False, heads=8)
PREFILL = Case("prefill_small", rows=8, context=1024, prefill=True, heads=8)
SAMPLES = [3.0, 1.0, 2.0]
H200 = (9, 0)


def stored(figures: dict[str, dict[str, float]], device: str = "NVIDIA H200") -> peers.StoredTopk:
    doc = {
        "provenance": {"device": device, "timestamp": "2026-12-01T00:00:00Z"},
        "cases": {
            case: {k: {"median_us": v, "samples_us": [v]} for k, v in kernels.items()}
            for case, kernels in figures.items()
        },
    }
    return peers.load_stored_topk(json.dumps(doc))


STORED = stored(
    {
        "decode_small": {"cooperative_topk": 10.0, "persistent_topk": 7.0},
        "prefill_small": {"top_k_per_row_prefill": 100.0},
    }
)


class Timer:
    """The bench's timer with no clock: declaring an arm runs its step once
    (as the graph capture's warm-up would) and returns a list that stays empty
    until ``run``, which fills every arm's with fixed samples and then runs the
    finishes in order, as ``ArmTimer.run`` does after timing."""

    def __init__(self, during=None) -> None:
        self.arms: list[list[float]] = []
        self.finishes = []
        self.during = during  # what else happens on the device while the arms run

    def __call__(self, fn) -> list[float]:
        fn()
        self.arms.append([])
        return self.arms[-1]

    def then(self, finish) -> None:
        self.finishes.append(finish)

    def run(self) -> None:
        for samples in self.arms:
            samples.extend(SAMPLES)
        if self.during is not None:
            self.during()
        for finish in self.finishes:
            finish()


def env(dg=None, ops=None, table=STORED, device="NVIDIA H200", capability=H200):
    return peers.PeerEnv(
        deep_gemm=peers.Found(dg, "fake deep_gemm") if dg else peers.Found(None, "no DeepGEMM"),
        vllm_ops=peers.Found(
            {n: getattr(ops, n) for _, n in peers.VLLM_OPS} if ops else None,
            "live: fake" if ops else "vllm._C_stable_libtorch does not import (test)",
        ),
        stored=table,
        device_name=device,
        capability=capability,
        sms=4,
    )


def run_peers(case, peer_env, rows=(), during=None):
    result = BenchResult("indexer", {})
    result.results.extend(dict(r) for r in rows)
    timer = Timer(during)
    stock.peer_arms(result, case, make_inputs(case, "cpu"), peer_env, timer, {"floor": 1.0})
    assert len(result.results) == len(rows), "a peer row was added before its arm was timed"
    timer.run()
    return result, {r["arm"]: r for r in result.results}


def b12x_row(case, arm, median):
    return {"case": case.name, "arm": arm, "median_us": median, "samples_us": [median]}


# --- the calls, as vLLM makes them ------------------------------------------------------------


def test_decode_arms_call_deepgemm_like_vllm_and_stock_adds_the_stored_top_k():
    dg = FakeDeepGemm()
    result, rows = run_peers(DECODE, env(dg), [b12x_row(DECODE, "b12x", 24.0)])
    assert result.ok, result.notes
    assert set(rows) == {"b12x", "deepgemm_logits", "deepgemm_metadata", "stock_vllm"}
    logits = rows["deepgemm_logits"]
    assert logits["check_ok"] and logits["logits_max_rel_err"] < 1e-5
    assert logits["held_logits_max_rel_err"] < 1e-5 and logits["logits_made_rel_err"] < 1e-5
    assert logits["check_rows"] == DECODE.rows and logits["max_model_len"] == DECODE.context
    assert logits["samples_us"] == SAMPLES and logits["floor"] == 1.0
    s = rows["stock_vllm"]
    # vLLM's auto backend: 4 rows of top-512 on sm_90 -> cooperative_topk (10 us stored)
    assert s["topk_kernel"] == "cooperative_topk" and s["topk_us"] == 10.0
    assert s["topk_source"] == "stored: vllm_topk_h200.json (NVIDIA H200, 2026-12-01)"
    assert "L2 flushed" in s["topk_timing"]
    assert s["samples_us"] == [x + 10.0 for x in SAMPLES]  # the measured logits + the figure
    assert s["measured_part_us"] == statistics.median(SAMPLES)
    assert (s["topk_best_kernel"], s["topk_best_us"]) == ("persistent_topk", 7.0)
    assert s["stock_best_us"] == statistics.median(SAMPLES) + 7.0
    assert "deepgemm_metadata" in s["excludes"]
    assert rows["b12x"]["vs_stock"] == pytest.approx(24.0 / 12.0)


def test_prefill_gathers_k_with_torch_when_vllms_gather_is_absent():
    # The fake scores from the gathered buffers, so the logits check also checks the gather.
    dg = FakeDeepGemm()
    result, rows = run_peers(PREFILL, env(dg))
    assert result.ok, result.notes
    assert rows["kgather"]["kgather_impl"].startswith("torch index_select")
    assert rows["deepgemm_logits"]["check_ok"]
    assert rows["deepgemm_logits"]["max_seqlen_k"] == PREFILL.context
    s = rows["stock_vllm"]
    assert s["topk_kernel"] == "top_k_per_row_prefill" and s["topk_us"] == 100.0
    assert s["kgather_impl"] == rows["kgather"]["kgather_impl"]
    assert "excludes" not in s
    assert "paged_logits" not in dg.calls and "metadata" not in dg.calls


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_a_wrong_peer_call_fails_the_logits_check_and_the_run(case):
    result, rows = run_peers(case, env(FakeDeepGemm(ignore_scales=True)))
    assert rows["deepgemm_logits"]["check_ok"] is False
    assert rows["deepgemm_logits"]["logits_max_rel_err"] > peers.LOGITS_REL_TOL
    assert not result.ok
    assert any("CHECK FAILED: deepgemm_logits" in n for n in result.notes)


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_logits_written_into_during_the_timing_fail_the_run_and_say_so(case):
    dg = FakeDeepGemm()

    def overwrite_every_logits_so_far():
        for out in dg.outputs:
            out.mul_(-3.0)

    result, rows = run_peers(case, env(dg), during=overwrite_every_logits_so_far)
    row = rows["deepgemm_logits"]
    assert row["check_ok"] is False and not result.ok
    # right when made and in a call after the timing: only the held tensor changed
    assert row["logits_made_rel_err"] < 1e-5 and row["logits_max_rel_err"] < 1e-5
    assert row["held_logits_max_rel_err"] > peers.LOGITS_REL_TOL
    (note,) = [n for n in result.notes if "CHECK FAILED" in n]
    assert "something wrote into them while the case's arms ran" in note


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_live_vllm_ops_run_the_whole_stock_call_and_its_selection_is_checked(case):
    ops = FakeVllmOps()
    result, rows = run_peers(case, env(FakeDeepGemm(), ops))
    assert result.ok, result.notes
    s = rows["stock_vllm"]
    kernel = "top_k_per_row_prefill" if case.prefill else "cooperative_topk"
    assert s["topk_source"] == f"live: torch.ops._C.{kernel}" and s["check_ok"]
    assert s["samples_us"] == SAMPLES  # one graph: no stored figure added
    assert rows["topk_only:vllm"]["topk_kernel"] == kernel
    assert s["topk_us"] == rows["topk_only:vllm"]["median_us"]
    if case.prefill:
        assert rows["kgather"]["kgather_impl"] == "vLLM cp_gather_indexer_k_quant_cache"
        assert "cp_gather_indexer_k_quant_cache" in ops.calls
        assert "topk_only:vllm_persistent" not in rows
    else:
        assert rows["topk_only:vllm_persistent"]["topk_kernel"] == "persistent_topk"
        assert {"cooperative_topk", "persistent_topk"} <= set(ops.calls)


def test_a_kernel_this_bench_cannot_call_live_falls_back_to_the_stored_figure():
    # top-256 is no radix size: vLLM runs top_k_per_row_decode, which is not called live here
    case = Case("decode_small", rows=4, context=1024, prefill=False, heads=8, topk=256)
    table = stored({"decode_small": {"top_k_per_row_decode": 5.0}})
    _, rows = run_peers(case, env(FakeDeepGemm(), FakeVllmOps(), table=table))
    assert rows["stock_vllm"]["topk_kernel"] == "top_k_per_row_decode"
    assert rows["stock_vllm"]["topk_source"].startswith("stored:")


def test_without_a_stored_figure_there_is_no_stock_row_and_b12x_says_so():
    result, rows = run_peers(
        DECODE, env(FakeDeepGemm(), table=stored({})), [b12x_row(DECODE, "b12x_fast", 9.0)]
    )
    assert "stock_vllm" not in rows and "deepgemm_logits" in rows
    assert rows["b12x_fast"]["vs_stock"] is None
    (note,) = [n for n in result.notes if "no stock_vllm row" in n]
    assert "does not import (test)" in note and "no stored figure" in note


def test_stored_figures_are_for_their_device_only():
    result, rows = run_peers(DECODE, env(FakeDeepGemm(), device="NVIDIA H100 80GB HBM3"))
    assert "stock_vllm" not in rows
    assert any("are for NVIDIA H200, not NVIDIA H100" in n for n in result.notes)


def test_without_deepgemm_no_peer_rows_and_every_b12x_row_still_gets_vs_stock():
    _, rows = run_peers(
        DECODE, env(), [b12x_row(DECODE, "b12x", 5.0), b12x_row(DECODE, "score_only:b12x", 2.0)]
    )
    assert set(rows) == {"b12x", "score_only:b12x"}
    assert rows["b12x"]["vs_stock"] is None
    assert rows["score_only:b12x"]["vs_peer"] is None and rows["score_only:b12x"]["peer"] is None


def test_deepgemm_pdl_follows_vllm():
    for capability, want in (((9, 0), True), ((8, 9), False), ((12, 0), True)):
        dg = FakeDeepGemm()
        assert peers.enable_pdl_as_vllm(dg, capability) is want and dg.pdl is want
    assert peers.enable_pdl_as_vllm(SimpleNamespace(), (9, 0)) is False  # no set_pdl


# --- which top-k vLLM runs --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "kernel"),
    [
        ({"prefill": True, "rows": 4096}, "top_k_per_row_prefill"),
        ({"rows": 64}, "cooperative_topk"),
        ({"rows": 1}, "cooperative_topk"),
        ({"rows": 65}, "persistent_topk"),
        ({"rows": 8, "logits_row_stride": 1026}, "persistent_topk"),
        ({"rows": 8, "capability": (12, 0)}, "persistent_topk"),
        ({"rows": 8, "capability": (8, 9)}, "persistent_topk"),
        ({"rows": 8, "topk": 2048, "capability": (10, 0)}, "cooperative_topk"),
        ({"rows": 8, "topk": 256}, "top_k_per_row_decode"),
    ],
)
def test_the_top_k_vllm_auto_picks(kwargs, kernel):
    args = {"prefill": False, "topk": 512, "logits_row_stride": 32768, "capability": H200}
    assert peers.vllm_topk_kernel(**{**args, **kwargs}) == kernel


def test_on_h200_stock_uses_cooperative_for_the_decode_cases_and_per_row_for_prefill():
    picked = {
        name: peers.vllm_topk_kernel(
            prefill=CASES[name].prefill,
            rows=CASES[name].rows,
            topk=CASES[name].topk,
            logits_row_stride=CASES[name].context,
            capability=H200,
        )
        for name in DEFAULT_CASES
    }
    assert picked == {
        "decode_r64_L32768": "cooperative_topk",
        "decode_r1_L131072": "cooperative_topk",
        "prefill_r4096_L32768": "top_k_per_row_prefill",
    }


# --- the stored figures -------------------------------------------------------------------------


def test_the_packaged_figures_cover_what_stock_runs_on_every_default_case():
    table = peers.load_stored_topk()
    assert table.device == "NVIDIA H200" and table.label.startswith("stored: ")
    for name, kernel in [
        ("decode_r64_L32768", "cooperative_topk"),
        ("decode_r1_L131072", "cooperative_topk"),
        ("prefill_r4096_L32768", "top_k_per_row_prefill"),
    ]:
        figure, why = table.lookup(name, kernel, "NVIDIA H200")
        assert figure is not None and figure > 0 and why == ""
    figure, why = table.lookup("decode_r16_L65536", "cooperative_topk", "NVIDIA H200")
    assert figure is None and "decode_r16_L65536" in why


def test_each_packaged_median_is_the_median_of_its_samples_and_provenance_is_kept():
    from importlib.resources import files

    doc = json.loads(files("b12x.bench").joinpath(peers.STORED_TOPK_FILE).read_text())
    assert {"copied_from", "device", "timestamp", "kernels_built_from"} <= set(doc["provenance"])
    for kernels in doc["cases"].values():
        for fig in kernels.values():
            assert fig["median_us"] == statistics.median(fig["samples_us"])


# --- finding the peers ------------------------------------------------------------------------


def importer(modules):
    def import_module(name):
        if name not in modules:
            raise ModuleNotFoundError(f"No module named {name!r}")
        if isinstance(modules[name], Exception):
            raise modules[name]
        return modules[name]

    return import_module


def test_deepgemm_is_found_in_vllms_order():
    dg = FakeDeepGemm()
    found = peers.import_deep_gemm(importer({"vllm.third_party.deep_gemm": dg}))
    assert found.module is dg and found.detail.startswith("vllm.third_party.deep_gemm fake")
    first = FakeDeepGemm()
    found = peers.import_deep_gemm(importer({"deep_gemm": first, "vllm.third_party.deep_gemm": dg}))
    assert found.module is first


def test_deepgemm_that_does_not_import_or_lacks_a_call_is_skipped_with_the_reasons():
    broken = RuntimeError("JIT include folder missing")
    old = SimpleNamespace(__version__="2.1.0", fp8_fp4_mqa_logits=None)
    modules = {"deep_gemm": broken, "vllm.third_party.deep_gemm": old}
    found = peers.import_deep_gemm(importer(modules))
    assert not found.ok
    assert "deep_gemm: RuntimeError: JIT include folder missing" in found.detail
    assert "vllm.third_party.deep_gemm 2.1.0 has no fp8_fp4_paged_mqa_logits" in found.detail
    assert "README" in found.detail


def test_vllm_ops_live_only_from_the_real_library():
    ops = FakeVllmOps()
    real = SimpleNamespace()
    found = peers.import_vllm_ops(importer({peers.VLLM_OPS_MODULE: real}), ops.namespace)
    assert found.ok and set(found.module) == {n for _, n in peers.VLLM_OPS}
    stand_in = SimpleNamespace(B12X_STAND_IN=True)
    found = peers.import_vllm_ops(importer({peers.VLLM_OPS_MODULE: stand_in}), ops.namespace)
    assert not found.ok and "stand-in" in found.detail
    found = peers.import_vllm_ops(importer({}), ops.namespace)
    assert not found.ok and "vllm._C_stable_libtorch does not import" in found.detail

    def partial(ns):
        return SimpleNamespace() if ns == "_C_cache_ops" else ops.namespace(ns)

    found = peers.import_vllm_ops(importer({peers.VLLM_OPS_MODULE: real}), partial)
    assert "torch.ops._C_cache_ops.cp_gather_indexer_k_quant_cache is not registered" in (
        found.detail
    )


# --- checks and ratios ------------------------------------------------------------------------


def test_logits_error_is_relative_to_each_rows_magnitude_and_ignores_the_tail():
    ref = torch.tensor([[4.0, -2.0, 1.0, 0.0], [0.5, 0.25, 0.0, 0.0]])
    got = ref.clone()
    got[0, 1] += 0.004  # 1e-3 of row 0's largest
    got[1, 3] = float("nan")  # past row 1's length: never read
    assert peers.logits_rel_err(got, ref, [4, 2]) == pytest.approx(1e-3, rel=1e-4)
    got[1, 0] += 0.001  # 2e-3 of row 1's largest
    assert peers.logits_rel_err(got, ref, [4, 2]) == pytest.approx(2e-3, rel=1e-4)


def test_check_rows_spread_over_the_batch():
    assert peers.check_rows(5) == [0, 1, 2, 3, 4]
    rows = peers.check_rows(4096)
    assert len(rows) == peers.CHECK_ROWS and rows[0] == 0 and rows[-1] == 4095
    assert rows == sorted(set(rows))


def test_a_selection_is_checked_against_the_reference_up_to_its_tie_tolerance():
    """The check the b12x arms and stock's share: the reference's own top-k
    passes; a wrong key fails; the boundary's neighbour passes only within
    the tolerance."""
    from b12x.attention.dsa_indexer import reference

    case = DECODE
    inputs = make_inputs(case, "cpu")
    q, w, kcache, table, lengths, _ = inputs
    logits = reference.paged_logits(q, w, kcache, table, lengths)
    cols = torch.arange(logits.shape[1])
    logits = logits.masked_fill(cols[None, :] >= lengths[:, None], float("-inf"))
    order = logits.sort(dim=1, descending=True).indices.int()
    best = order[:, : case.topk].clone()
    assert peers.selection_error(best, inputs, case.topk, 0.0) == (case.rows, None)
    worst = best.clone()
    worst[0, 0] = order[0, -1]  # the row's lowest key in place of its highest
    n, err = peers.selection_error(worst, inputs, case.topk, peers.LOGITS_REL_TOL)
    assert n == case.rows and err is not None
    swapped = best.clone()
    swapped[0, case.topk - 1] = order[0, case.topk]  # the k-th for the (k+1)-th
    gap = float(logits[0, order[0, case.topk - 1]] - logits[0, order[0, case.topk]])
    scale = float(logits.masked_fill(logits.isinf(), 0).abs().max())  # over every checked row
    assert peers.selection_error(swapped, inputs, case.topk, 0.0)[1] is not None
    assert peers.selection_error(swapped, inputs, case.topk, 2 * gap / scale)[1] is None


def test_ratios_go_to_whole_call_rows_and_stage_rows_get_their_peer():
    case = "c"
    rows = [
        {"case": case, "arm": a, "median_us": m}
        for a, m in [
            ("b12x", 90.0),
            ("b12x_fast", 80.0),
            ("b12x_f16", 120.0),
            ("score_only:b12x_fast", 70.0),
            ("topk_only:b12x", 20.0),
            ("topk_only:torch", 100.0),
            ("deepgemm_logits", 80.0),
        ]
    ] + [
        {
            "case": case,
            "arm": "stock_vllm",
            "median_us": 100.0,
            "topk_kernel": "cooperative_topk",
            "topk_source": "stored: file",
            "topk_us": 16.0,
        },
        {"case": "other", "arm": "b12x", "median_us": 1.0},
    ]
    peers.attach_ratios(rows, case)
    by = {(r["case"], r["arm"]): r for r in rows}
    assert by[(case, "b12x")]["vs_stock"] == 0.9
    assert by[(case, "b12x_fast")]["vs_stock"] == 0.8 and by[(case, "b12x_f16")]["vs_stock"] == 1.2
    assert by[(case, "score_only:b12x_fast")]["vs_peer"] == 70 / 80
    assert by[(case, "score_only:b12x_fast")]["peer"] == "deepgemm_logits"
    assert by[(case, "topk_only:b12x")]["vs_peer"] == 20 / 16
    assert by[(case, "topk_only:b12x")]["peer"] == "vLLM cooperative_topk (stored)"
    assert "vs_stock" not in by[(case, "topk_only:torch")]
    assert "vs_peer" not in by[(case, "deepgemm_logits")]
    assert "vs_stock" not in by[("other", "b12x")]


def test_the_table_shows_its_columns_and_the_json_keeps_every_key(tmp_path, capsys):
    result = BenchResult("indexer", {}, columns=["vs_stock", "logits_max_rel_err", "topk_source"])
    result.add("c", "b12x", [2.0], vs_stock=0.5, hbm_floor_us=64.6)
    result.add("c", "stock_vllm", [4.0], topk_source="stored: x", hbm_floor_us=64.6)
    result.add("c", "deepgemm_logits", [3.0], logits_max_rel_err=3.04e-4)
    path = tmp_path / "out.json"
    write_report(result, str(path))
    lines = capsys.readouterr().out.splitlines()
    header = lines[1].split()
    assert header == ["case", "arm", "median_us", "min_us", "vs_stock", "logits_max_rel_err",
                      "topk_source"]  # fmt: skip
    assert "3.04e-04" in lines[5] and "0.500" in lines[3]
    rows = json.loads(path.read_text())["results"]
    assert rows[0]["hbm_floor_us"] == 64.6 and rows[1]["topk_source"] == "stored: x"


# --- the guards past each plan's scratch ------------------------------------------------------


def test_a_write_past_a_plans_scratch_fails_the_run_and_names_the_plan():
    guards = ScratchGuards(device="cpu")
    clean, overrun = SimpleNamespace(nbytes=4096), SimpleNamespace(nbytes=1000)
    a, b = guards.scratch(clean), guards.scratch(overrun)
    assert a.numel() == 4096 + ScratchGuards.GUARD_BYTES
    a[:4096].fill_(0)  # the plan's own bytes are its to write
    b[:1003].fill_(0)  # three bytes past nbytes
    result = BenchResult("indexer", {})
    guards.check(result, "case_x")
    assert not result.ok
    (note,) = result.notes
    assert note.startswith("case_x: CHECK FAILED: namespace(nbytes=1000) wrote 3 bytes")
    assert "past its scratch's 1000" in note


# --- the case helpers the bench and the GPU tools share -----------------------------------------


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_a_case_plans_binds_and_runs_on_the_cpu_reference(case):
    from b12x.attention import dsa_indexer as di

    caps = case_caps(case, device="cpu")
    assert (caps.num_q_heads, caps.max_q_rows, caps.topk) == (case.heads, case.rows, case.topk)
    assert caps.mode == ("prefill" if case.prefill else "decode")
    plan = di.plan(caps)
    inputs = make_inputs(case, "cpu")
    idx = torch.full((case.rows, case.topk), -7, dtype=torch.int32)
    binding = bind_case(plan, inputs, torch.empty(plan.nbytes, dtype=torch.uint8), idx)
    di.run(binding)
    n, err = peers.selection_error(idx, inputs, case.topk, peers.EXACT_TIE_REL)
    assert err is None and n > 0


@pytest.mark.parametrize("case", [DECODE, PREFILL], ids=lambda c: c.name)
def test_ascending_page_order_keeps_every_page_and_sorts_each_table_row(case: Case) -> None:
    """--page-order ascending moves no other byte: the same cache, Q and
    weights, each table row the same ids in ascending order (prefill's rows
    share one), and every cache page still some row's, once."""
    rand = make_inputs(case, "cpu")
    asc = make_inputs(case, "cpu", page_order="ascending")
    for a, b in zip(rand, asc, strict=True):
        if a.shape != b.shape or not torch.equal(a, b):
            assert a is rand[3], "only the page table differs"
    table, rows = asc[3], 1 if case.prefill else case.rows
    assert torch.equal(table, rand[3].sort(dim=1).values)
    assert bool((table[:, 1:] > table[:, :-1]).all())
    assert sorted(table[:rows].flatten().tolist()) == list(range(rows * case.width))
    assert not torch.equal(rand[3], table), "random order is not already sorted"


def test_an_unknown_page_order_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"page_order expected one of .*got 'zigzag'"):
        make_inputs(DECODE, "cpu", page_order="zigzag")
