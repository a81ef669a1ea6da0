"""The plan's MMA flavor (resolved by the plan, forced only by the test/bench option of
the uncached builder), and the page constants exported once from the Rust core."""

from __future__ import annotations

import b12x
import pytest
from b12x import _core
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref
from b12x.integration.vllm import indexer as vllm_indexer


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


def test_launch_scaffolding_is_gone():
    for name in ("_indexer_force_mma_flavor", "fill_topk_padding", "INDEXER_KERNELS_WIRED"):
        assert not hasattr(_core, name), name
    assert not hasattr(b12x.cuda, "fill_topk_padding")
