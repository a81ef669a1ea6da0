"""b12x's all-reduce inside the real vLLM 0.33: two ranks, vLLM's own communicator code.

Every test runs a scenario of :mod:`tp_scenarios` on both ranks of a real
vLLM TP group (gloo, CPU); the IPC runtime is the one stand-in. Numbers in
the names refer to "What was found" in issue 12.
"""

from __future__ import annotations

import pytest


def both(results):
    """The two ranks agree; their common result."""
    assert len(results) == 2
    assert results[0] == results[1], results
    return results[0]


def test_switch_off_leaves_vllms_own_custom_all_reduce(tp_ranks):
    state = both(tp_ranks.run("switch_off_is_stock"))
    assert state["slot"] == "CustomAllreduce"
    assert state["slot_module"] == "vllm.distributed.device_communicators.custom_all_reduce"


def test_item2_4_cuda_communicator_builds_b12x_from_its_own_call(tp_ranks):
    state = both(tp_ranks.run("built_from_vllm_call"))
    assert state["slot"] == "B12xCustomAllreduce"
    assert state["stock_type"] == "vllm.distributed.device_communicators.custom_all_reduce"
    assert state["b12x_disabled"] is False and state["disabled"] is False
    assert state["runtime_world"] == 2
    # derived from the config alone: token counts 1..64 (max_num_batched_tokens) and the
    # capture size 128, hidden 256 fp32, all one-shot under the default ceilings
    assert state["declared"] == [65] and state["routes"] == 65
    assert state["fused_probe"] is True


def test_item2_dispatch_declared_shapes_on_b12x_the_rest_on_vllms_chain(tp_ranks):
    results = both(tp_ranks.run("dispatch"))
    assert all(r["correct"] for r in results.values()), results
    on_b12x = {label for label, r in results.items() if r["b12x"]}
    assert on_b12x == {"m1", "m64", "capture128"}
    for label in ("eager200", "other_hidden", "three_d"):
        assert results[label]["b12x"] == 0


def test_each_all_reduce_is_admitted_once(tp_ranks):
    # CudaCommunicator asks should_custom_ar, then calls custom_all_reduce: one admission
    results = both(tp_ranks.run("dispatch"))
    assert {label: r["admissions"] for label, r in results.items()} == dict.fromkeys(results, 1)


def test_item5_graph_capture_with_declarations_runs_on_b12x(tp_ranks):
    seen = both(tp_ranks.run("graph_capture", declared=True))
    assert seen["context_stream"] and seen["correct"]
    assert seen["capturing"] and seen["capturing_with_stream"] and not seen["after"]
    assert seen["runtime_captures"] == 2  # graph_capture, then capture(stream=...)
    assert seen["b12x_calls"] == 1


def test_item5_graph_capture_with_nothing_declared_does_not_raise(tp_ranks):
    seen = both(tp_ranks.run("graph_capture", declared=False))
    assert seen["context_stream"] and seen["correct"]
    assert not seen["capturing"] and seen["runtime_captures"] == 0
    assert seen["b12x_calls"] == 0  # the captured all-reduce ran on vLLM's chain


def test_item6_destroy_closes_the_runtime(tp_ranks):
    state = both(tp_ranks.run("teardown"))
    assert state == {"live_before": 1, "live_after": 0, "closed": 1, "ca_comm": None}


def test_item6_all_gather_and_reduce_scatter_decline_cleanly(tp_ranks):
    seen = both(tp_ranks.run("gather_scatter"))
    assert seen["gather"] is None and seen["scatter"] is None
    assert seen["gather_fallback"] and seen["b12x_calls"] == 0


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "torch.compile"])
def test_item6_fused_op_matches_vllms_all_reduce_then_rms_norm(tp_ranks, compiled):
    results = both(tp_ranks.run("fused_op", compiled=compiled))
    assert results.pop("probe") is True
    assert results.pop("norms_declared") == 2  # weight.data aliases found as one weight each
    for label, r in results.items():
        assert r["normed"] and r["residual"] and r["x_untouched"], (label, r)
    on_b12x = {label for label, r in results.items() if r["fused_calls"] == 1}
    assert on_b12x == {"decode_a", "decode_b", "decode_a_again"}
    # the profile-sized calls only record their norms; one declaration covers both
    assert {label: r["declares"] for label, r in results.items()} == {
        "profile_a": 0,
        "profile_b": 0,
        "decode_a": 1,
        "decode_b": 0,
        "decode_a_again": 0,
        "beyond_budget": 0,
    }


@pytest.mark.parametrize(
    ("case", "logged"),
    [
        ("multi_node", "declined: the group spans nodes"),
        ("setup_failed", "declined: set-up failed: setup step 'open peers'"),
        ("unsupported_gpu", "disabled: setup step 'allocate' failed"),
    ],
)
def test_declines_to_stock_vllm_and_logs_once(tp_ranks, case, logged):
    state = both(tp_ranks.run("declines", case=case))
    assert state["slot"] == "B12xCustomAllreduce"
    assert state["b12x_disabled"] is True and state["routes"] == 0
    assert state["disabled"] is True  # vLLM's own custom all-reduce has no GPU here either
    assert state["correct"]
    assert len(state["warnings"]) == 1 and logged in state["warnings"][0]


def test_the_forks_constructor_form_builds_the_slot_and_leaves_nothing_half_built(tp_ranks):
    state = both(tp_ranks.run("fork_constructor"))
    assert state == {"taken": True, "correct": True, "stock": "CustomAllreduce", "unraisable": []}
