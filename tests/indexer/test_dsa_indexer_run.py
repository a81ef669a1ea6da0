"""dsa_indexer.run: the adapter-level call shape on CPU, every slot written, GPU dispatch."""

from __future__ import annotations

import math

import b12x
import pytest
import torch
from b12x import _core
from b12x import cuda as b12x_cuda
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref
from b12x.errors import PageTableError
from dsa_indexer_cases import bind_all, caps_for, make_inputs, outputs

TOPK = 512


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    di.clear_caches()
    yield
    di.clear_caches()


class FakeWorkspace:
    """vLLM's workspace manager, reduced: fresh views of one growing buffer per call."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.uint8)
        self.calls = 0

    def get_simultaneous(self, *shapes_and_dtypes):
        self.calls += 1
        sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in shapes_and_dtypes]
        need = sum(-(-s // 256) * 256 for s in sizes)
        if self.buffer.numel() < need:
            self.buffer = torch.empty(need, dtype=torch.uint8)
        views, offset = [], 0
        for (shape, dtype), size in zip(shapes_and_dtypes, sizes, strict=True):
            views.append(self.buffer[offset : offset + size].view(dtype).view(shape))
            offset += -(-size // 256) * 256
        return views


class MiniAdapter:
    """The call pattern of vLLM's B12xC4SparseIndexer._run_paged_topk, with counters."""

    def __init__(self, topk):
        self.topk = topk
        self.plans = {}
        self.workspace = FakeWorkspace()
        self.counts = {"plan": 0, "bind": 0, "run": 0}

    def run_paged_topk(self, q, weights, kv_cache, table, seq_lens, active_width, out, scores):
        rows, shared = q.shape[0], table.stride(0) == 0 and q.shape[0] > 1
        flat_cache = kv_cache.view(kv_cache.shape[0], -1)  # [blocks, 64, 132] -> [blocks, 8448]
        key = (q.device, q.shape[1], max(rows, 1), max(table.shape[1], 1), shared)
        plan = self.plans.get(key)
        if plan is None:
            self.counts["plan"] += 1
            plan = self.plans[key] = di.plan(
                di.Caps(
                    device=q.device,
                    num_q_heads=q.shape[1],
                    max_q_rows=max(rows, 1),
                    max_page_table_width=max(table.shape[1], 1),
                    topk=self.topk,
                    mode="prefill" if shared else "decode",
                )
            )
        scratch = self.workspace.get_simultaneous(*plan.shapes_and_dtypes())
        self.counts["bind"] += 1
        before = out.clone()
        binding = di.bind(
            plan,
            scratch=scratch,
            q_fp8=q,
            query_weights=weights,
            index_k_cache=flat_cache,
            page_table=table,
            cache_lengths=seq_lens,
            active_width=active_width,
            output_indices=out,
            output_scores=scores,
        )
        assert binding.output_indices is out and binding.output_scores is scores
        assert torch.equal(out, before)  # bind does not write
        self.counts["run"] += 1
        assert di.run(binding) is out


def vllm_cache(inputs):
    """The index cache as vLLM allocates it: [blocks, 64, 132] uint8 holding planar pages."""
    flat = inputs["index_k_cache"]
    cache = torch.empty((flat.shape[0], 64, 132), dtype=torch.uint8)
    cache.view(flat.shape[0], 8448).copy_(flat)
    return cache


@pytest.mark.parametrize("mode", ["decode", "prefill"])
def test_adapter_shape_one_plan_two_binds_two_runs(mode):
    # reference §8: rows 3, heads 16, cache (4, 64, 132), lengths 128, table (3, 2)
    inputs = make_inputs(rows=3, heads=16, width=2, lengths=128, pages=4, mode=mode)
    cache = vllm_cache(inputs)
    adapter = MiniAdapter(TOPK)
    want = ref.indexer_topk(**inputs, topk=TOPK)
    for _ in range(2):
        out, scores = outputs(3, TOPK)
        adapter.run_paged_topk(
            inputs["q_fp8"],
            inputs["query_weights"],
            cache,
            inputs["page_table"],
            inputs["cache_lengths"],
            inputs["active_width"],
            out,
            scores,
        )
        assert not (out == 7777).any() and not scores.isnan().any()  # every slot written
        assert torch.equal(out, want[0]) and torch.equal(scores, want[1])
    assert adapter.counts == {"plan": 1, "bind": 2, "run": 2}
    assert adapter.workspace.calls == 2
    assert di.cached_plan_count() == 1


@pytest.mark.parametrize(
    ("case", "kw"),
    [
        ("decode", {"rows": 3, "heads": 4, "width": 12, "lengths": [700, 300, 0]}),
        (
            "prefill",
            {"rows": 4, "heads": 4, "width": 9, "lengths": [9, 200, 513], "mode": "prefill"},
        ),
        ("unmapped", {"rows": 2, "heads": 2, "width": 6, "lengths": 380, "unmapped": ((0, 1),)}),
        ("padded", {"rows": 2, "heads": 2, "width": 4, "lengths": 250, "page_stride": 8448 + 256}),
        ("active width", {"rows": 2, "heads": 2, "width": 12, "lengths": 700, "active_width": 600}),
    ],
)
@pytest.mark.parametrize("space", ["logical", "physical"])
def test_cpu_run_writes_the_reference_into_every_slot(case, kw, space):
    if case == "prefill":
        kw = {**kw, "lengths": [*kw["lengths"], 570]}
    inputs = make_inputs(**kw)
    rows = inputs["q_fp8"].shape[0]
    plan = di.plan(caps_for(inputs, TOPK, mode=kw.get("mode", "decode"), output_index_space=space))
    out, scores = outputs(rows, TOPK)
    assert di.run(bind_all(plan, inputs, out, scores)) is out
    want_idx, want_scores = ref.indexer_topk(**inputs, topk=TOPK, index_space=space)
    assert torch.equal(out, want_idx) and torch.equal(scores, want_scores)
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], inputs["active_width"])
    ref.assert_topk_equivalent(
        out, scores, logits, cand, TOPK, page_table=inputs["page_table"], index_space=space
    )


def test_run_without_scores_and_with_trailing_singleton_weights():
    inputs = make_inputs(rows=2, heads=3, width=10, lengths=[600, 64])
    inputs["query_weights"] = inputs["query_weights"][..., None]
    plan = di.plan(caps_for(inputs, TOPK))
    out, _ = outputs(2, TOPK)
    di.run(bind_all(plan, inputs, out))
    assert torch.equal(out, ref.indexer_topk(**inputs, topk=TOPK)[0])


def test_one_plan_serves_smaller_calls():
    big = make_inputs(rows=5, heads=2, width=10, lengths=300)
    plan = di.plan(caps_for(big, TOPK))
    small = make_inputs(rows=2, heads=2, width=3, lengths=[150, 192], seed=1)
    out, scores = outputs(2, TOPK)
    di.run(bind_all(plan, small, out, scores))
    assert torch.equal(out, ref.indexer_topk(**small, topk=TOPK)[0])


def test_zero_rows():
    inputs = make_inputs(rows=0, heads=2, width=2, lengths=[], pages=2)
    plan = di.plan(caps_for(inputs, TOPK))
    out, scores = outputs(0, TOPK)
    assert di.run(bind_all(plan, inputs, out, scores)) is out


def test_scratch_views_alias_the_scratch():
    inputs = make_inputs(rows=2, heads=2, width=2, lengths=100)
    plan = di.plan(caps_for(inputs, TOPK))
    out, _ = outputs(2, TOPK)
    b = bind_all(plan, inputs, out)
    views = di.scratch_views(b)
    assert list(views) == list(plan.layout)
    for name, view in views.items():
        region = plan.layout[name]
        assert b.scratch.data_ptr() + region.offset == b.region_address(name)
        if region.nbytes:  # (an empty view reports data_ptr 0)
            assert view.data_ptr() == b.region_address(name)
        assert (view.dtype, tuple(view.shape)) == (region.dtype, region.shape)


def test_run_is_a_direct_forward_into_the_extension():
    assert di.run is _core.indexer_run and di.bind is _core.indexer_bind
    assert di.plan is _core.indexer_plan
    with pytest.raises(TypeError):
        di.run(object())


def test_cpu_page_ids_past_the_cache_are_unmapped_and_checked():
    inputs = make_inputs(rows=3, heads=2, width=4, lengths=[200, 250, 0], pages=8)
    table = inputs["page_table"]
    table[1, 3] = 2**31 - 1  # live (250 tokens reach column 3)
    table[0, 1] = 8  # one past the end, live
    table[2, 0] = 9  # row 2 has no live token: never read, never reported
    plan = di.plan(caps_for(inputs, TOPK, output_index_space="physical"))
    out, scores = outputs(3, TOPK)
    b = bind_all(plan, inputs, out, scores)
    di.check("cpu")  # nothing recorded yet
    di.run(b)
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(table, inputs["cache_lengths"], None, pages=8)
    assert not bool(cand[0, 64:128].any()) and not bool(cand[1, 192:256].any())
    ref.assert_topk_equivalent(
        out, scores, logits, cand, TOPK, page_table=table, index_space="physical"
    )
    assert int(out.max()) < 8 * 64  # physical indices only name real pages
    di.run(b)  # a second run does not overwrite the first record
    with pytest.raises(
        PageTableError,
        match=r"run: page_table\[0, 1\] expected a page id in \[0, 8\) \(the pages of "
        r"index_k_cache\) or negative \(unmapped\), got 8",
    ):
        b.check()
    b.check()  # the record was cleared
    table[0, 1] = 0
    di.run(b)
    with pytest.raises(ValueError, match=r"page_table\[1, 3\] .* got 2147483647"):
        di.check("cpu")
    with pytest.raises(b12x.DeviceError, match=r"check: device expected a torch\.device, 'cpu'"):
        di.check("gpu:0")
    with pytest.raises(b12x.DeviceError, match=r"check: device expected .* got 'meta'"):
        di.check("meta")


def test_is_supported_needs_a_gpu():
    if not b12x_cuda.is_available():
        assert di.is_supported() is False
    else:
        major, minor = _core.device_info(0)["compute_capability"]
        assert di.is_supported() is ((major, minor) >= (8, 9))


@pytest.mark.gpu
def test_cuda_run_dispatches_to_the_kernels():
    inputs = make_inputs(rows=2, heads=2, width=4, lengths=[200, 100], device="cuda")
    plan = di.plan(caps_for(inputs, TOPK))
    out, scores = outputs(2, TOPK, device="cuda")
    binding = bind_all(plan, inputs, out, scores)
    di.run(binding)
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], inputs["active_width"])
    ref.assert_topk_equivalent(out, scores, logits, cand, TOPK)
