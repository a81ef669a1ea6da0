"""Declaring: ``b12x.comm.pcie.DeclaredPlans``, the one path from declared
invocations to indexed plans, held by the runtime (``AllReduce.plans``) and
by the vLLM adapter where there is no runtime. CPU only.
"""

from __future__ import annotations

import pytest
import torch
from b12x.comm.pcie import FUSED, PLAIN, DeclaredPlans, Invocation, Limits
from b12x.errors import ConfigError, UndeclaredPlanError
from test_allreduce_routing import _stand_in

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


def test_declare_routes_prepares_and_swaps_the_index():
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    plans = DeclaredPlans(4, LIMITS, multiprocessors=132)
    index = plans.index
    declined = plans.declare(declarations(weight))
    routed = plans.declared_plans
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
    plans.declare([])  # a refresh replaces everything
    assert len(index) == 0 and plans.index is index


def test_the_runtime_declares_through_the_same_path():
    weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
    runtime = _stand_in(world=4, limits=LIMITS)
    runtime.declare(declarations(weight))
    plans = DeclaredPlans(4, LIMITS, multiprocessors=132)
    plans.declare(declarations(weight))
    assert type(runtime.plans) is DeclaredPlans  # held, not re-implemented
    held = runtime.plans.declared_plans
    seen = [(inv.name, p.route, p.geometry, p.staged_bytes) for inv, p in held]
    assert seen == [
        (inv.name, p.route, p.geometry, p.staged_bytes) for inv, p in plans.declared_plans
    ]
    assert len(runtime.plans) == len(plans) == 3
    # admission looks calls up in exactly that index
    x = torch.empty(64, 4096, dtype=torch.bfloat16)
    assert runtime.admit(x).plan is runtime.plans.plan_for(x)


def test_declared_plans_answer_lookups_and_never_raise_on_a_probe():
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
    assert not hasattr(plans, "admit")  # admission is a runtime's
    plans.clear()
    assert len(plans) == 0 and plans.declared_plans == []


def test_declaring_needs_limits():
    with pytest.raises(
        ConfigError, match=r"limits expected a b12x\.comm\.pcie\.Limits, got object"
    ):
        DeclaredPlans(2, object())
