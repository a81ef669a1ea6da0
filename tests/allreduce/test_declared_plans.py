"""Declaring without a runtime: ``b12x.comm.pcie.declare_plans`` and ``DeclaredPlans``.

The one path from declared invocations to indexed plans, used by the runtime
(``AllReduce.declare``), by the vLLM adapter where there is no runtime, and
by the tests' runtime doubles. CPU only.
"""

from __future__ import annotations

import pytest
import torch
from b12x.comm import pcie
from b12x.comm.pcie import FUSED, PLAIN, DeclaredPlanIndex, DeclaredPlans, Invocation, Limits
from b12x.errors import ConfigError, UndeclaredPlanError
from test_allreduce_routing import _bare_runtime

LIMITS = Limits(oneshot_max=16 << 10, fused_max=16 << 10, twoshot_max=768 << 10)
HIDDEN = 1024


def declarations(weight):
    bf16 = torch.bfloat16
    return [
        Invocation("one", PLAIN, (1, HIDDEN), bf16),
        Invocation("one.again", PLAIN, (1, HIDDEN), bf16),  # equal: shares one's plan
        Invocation("big", PLAIN, (64, 4096), bf16),  # 512 KiB: two-shot
        Invocation("odd", PLAIN, (10, 4096), bf16),  # 80 KiB, 10 rows do not split over 4
        Invocation("fused", FUSED, (4, HIDDEN), bf16, norm_weight=weight, epsilon=1e-6),
    ]


def test_declare_plans_routes_prepares_and_swaps_the_index():
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    index = DeclaredPlanIndex()
    routed, declined = pcie.declare_plans(index, declarations(weight), 4, LIMITS, 132)
    assert [(inv.name, plan.route) for inv, plan in routed] == [
        ("one", "oneshot"),
        ("one.again", "oneshot"),
        ("big", "twoshot"),
        ("fused", "oneshot_fused"),
    ]
    assert routed[0][1] is routed[1][1]  # equal declarations share one plan
    assert [inv.name for inv, _ in declined] == ["odd"] and "two-shot" in declined[0][1]
    assert index.declared() == routed and len(index) == 3
    assert index.lookup(torch.empty(64, 4096, dtype=torch.bfloat16)) is routed[2][1]
    pcie.declare_plans(index, [], 4, LIMITS, 132)  # a refresh replaces everything
    assert len(index) == 0


def test_the_runtime_declares_through_the_same_path():
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    runtime = _bare_runtime(world=4, limits=LIMITS)
    runtime.declare(declarations(weight))
    plans = DeclaredPlans(4, LIMITS, multiprocessors=132)
    plans.declare(declarations(weight))
    assert runtime.index is runtime._index  # the index admit() looks calls up in
    seen = [(inv.name, p.route, p.geometry, p.staged_bytes) for inv, p in runtime.declared_plans]
    assert seen == [
        (inv.name, p.route, p.geometry, p.staged_bytes) for inv, p in plans.declared_plans
    ]
    assert len(runtime.index) == len(plans) == 3


def test_declared_plans_answer_as_the_runtime_does_and_admit_nothing():
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    plans = DeclaredPlans(4, LIMITS)
    declined = plans.declare(declarations(weight))
    assert [inv.name for inv, _ in declined] == ["odd"]
    x = torch.empty(4, HIDDEN, dtype=torch.bfloat16)
    assert plans.has_plan_for(x, FUSED, weight, 1e-6) and not plans.has_plan_for(x)
    assert plans.plan_for(x, FUSED, weight, 1e-6).route == "oneshot_fused"
    with pytest.raises(UndeclaredPlanError, match="no declared plan for"):
        plans.plan_for(x)
    assert not plans.has_plan_for("not a tensor")  # never raises
    assert plans.admit(x, FUSED, weight, 1e-6, torch.zeros_like(x)) is None  # nothing runs
    plans.clear()
    assert len(plans) == 0 and plans.declared_plans == []


def test_declaring_needs_limits():
    with pytest.raises(
        ConfigError, match=r"limits expected a b12x\.comm\.pcie\.Limits, got object"
    ):
        DeclaredPlans(2, object()).declare([])
