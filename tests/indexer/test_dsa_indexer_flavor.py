"""The plan's MMA flavor (resolved by the plan, forced only by the test/bench option of
the uncached builder), and the page constants exported once from the Rust core."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref
from b12x.integration.vllm import indexer as vllm_indexer
from dsa_indexer_cases import bind_all, caps_for, make_inputs, outputs


def cpu_caps(**kw):
    args = dict(device="cpu", num_q_heads=16, max_q_rows=4, max_page_table_width=8, topk=512)
    return di.Caps(**{**args, **kw})


def test_page_constants_have_one_home():
    assert di.PAGED_INDEX_PAGE_SIZE == _core.INDEXER_PAGE_SIZE == ref.PAGE_SIZE == 64
    assert di.INDEX_HEAD_DIM == _core.INDEXER_HEAD_DIM == ref.HEAD_DIM == 128
    assert di.INDEX_PAGE_BYTES == _core.INDEXER_PAGE_BYTES == ref.PAGE_BYTES == 64 * (128 + 4)
    assert ref.SCALE_OFFSET == _core.INDEXER_SCALE_OFFSET == 64 * 128
    assert di.SUPPORTED_TOPK == _core.INDEXER_SUPPORTED_TOPK == (512, 1024, 2048)
    assert (vllm_indexer.PAGE_SIZE, vllm_indexer.HEAD_DIM) == (64, 128)
    assert vllm_indexer.PAGE_BYTES == di.INDEX_PAGE_BYTES


def test_a_cpu_plan_runs_the_reference():
    plan = di.plan(cpu_caps())
    assert plan.mma_flavor == "reference"
    assert repr(plan).endswith("mma_flavor=reference)")


def test_the_flavor_option_is_checked():
    with pytest.raises(b12x.ConfigError, match="mma_flavor expected None on a CPU plan"):
        _core.indexer_build_plan(cpu_caps(), mma_flavor="e4m3")
    with pytest.raises(
        b12x.ConfigError, match=r"plan: mma_flavor expected one of \{e4m3, f16, wgmma"
    ):
        _core.indexer_build_plan(cpu_caps(), mma_flavor="tf32")
    # the interned plan has no such option
    with pytest.raises(TypeError):
        di.plan(cpu_caps(), mma_flavor="e4m3")


def test_the_flavor_names_come_from_the_core():
    assert _core.INDEXER_MMA_FLAVORS == (
        "e4m3",
        "f16",
        "wgmma",
        "wgmma_fp8",
        "tma_fp8",
        "tma_f16",
    )
    for stage in ("topk_only", "score_only"):
        with pytest.raises(b12x.ConfigError, match="stages expected all on a CPU plan"):
            _core.indexer_build_plan(cpu_caps(), **{stage: True})
    with pytest.raises(b12x.ConfigError, match="topk_only, score_only expected at most one"):
        _core.indexer_build_plan(cpu_caps(), topk_only=True, score_only=True)


def test_launch_scaffolding_is_gone():
    for name in ("_indexer_force_mma_flavor", "fill_topk_padding", "INDEXER_KERNELS_WIRED"):
        assert not hasattr(_core, name), name
    assert not hasattr(b12x.cuda, "fill_topk_padding")


def test_precision_is_part_of_the_caps_and_the_plan():
    exact, fast = cpu_caps(), cpu_caps(precision="fast")
    assert (exact.precision, fast.precision) == ("exact", "fast")
    assert exact != fast and "precision=fast" in repr(fast)
    assert di.plan(fast) is not di.plan(exact)
    assert di.plan(fast).precision == "fast"
    # the CPU has no faster path: fast runs the reference, as exact does
    assert repr(di.plan(fast)).endswith("precision=fast, mma_flavor=reference)")
    with pytest.raises(
        b12x.ConfigError, match=r'Caps: precision expected one of \{exact, fast\}, got "tf32"'
    ):
        cpu_caps(precision="tf32")


def test_fast_equals_exact_where_there_is_no_faster_path():
    inputs = make_inputs(rows=3, heads=4, width=12, lengths=[700, 300, 0])
    results = []
    for precision in ("exact", "fast"):
        plan = di.plan(caps_for(inputs, 512, precision=precision))
        idx, scores = outputs(3, 512)
        di.run(bind_all(plan, inputs, idx, scores))
        results.append((idx, scores))
    (i0, s0), (i1, s1) = results
    assert torch.equal(i0, i1) and torch.equal(s0, s1)
