"""The launch chain on a real GPU: kernels load at plan time, runs enqueue on torch's
current stream (a side stream too), and a launch on an unloaded device is refused."""

from __future__ import annotations

import pytest
import torch
from b12x import _core, cuda
from b12x.attention import dsa_indexer as di
from b12x.attention.dsa_indexer import reference as ref
from dsa_indexer_cases import bind_all, caps_for, make_inputs, outputs

pytestmark = pytest.mark.gpu


def test_kernels_load_once_per_device():
    cuda.load_kernels(0)
    assert _core.kernels_loaded(0)
    cuda.load_kernels(0)  # idempotent


def test_a_plan_loads_the_kernels_and_resolves_its_flavor():
    inputs = make_inputs(rows=2, heads=16, width=4, lengths=[200, 100], device="cuda")
    plan = di.plan(caps_for(inputs, 512))
    assert _core.kernels_loaded(torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability()
    expected = {(9, 0): "tma_f16", (8, 9): "e4m3"}.get(
        (major, minor), "e4m3" if major == 12 else "f16"
    )
    assert plan.mma_flavor == expected and f"mma_flavor={expected}" in repr(plan)


def test_run_enqueues_on_a_side_stream():
    inputs = make_inputs(rows=3, heads=32, width=6, lengths=[300, 64, 0], device="cuda")
    plan = di.plan(caps_for(inputs, 512))
    out, scores = outputs(3, 512, device="cuda")
    b = bind_all(plan, inputs, out, scores)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        di.run(b)
    s.synchronize()
    logits = ref.paged_logits(**inputs)
    cand = ref.candidate_mask(inputs["page_table"], inputs["cache_lengths"], inputs["active_width"])
    ref.assert_topk_equivalent(out, scores, logits, cand, 512)


def test_the_status_word_reads_clean_without_a_run():
    cuda.load_kernels(0)
    di.check(0)  # syncs, reads the device's page-fault record: nothing recorded
