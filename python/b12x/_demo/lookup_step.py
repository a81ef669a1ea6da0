"""Declared all-reduce plans of the miniature model, and live lookups through the
adapter: what a TP rank decides for every all-reduce without any GPU."""

from __future__ import annotations

import timeit
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from b12x._demo import StepResult
from b12x.comm.pcie.invocation import FUSED, PLAIN

if TYPE_CHECKING:
    from b12x.comm.pcie import Invocation

LAYERS = 61  # DeepSeek V4's layer count
HIDDEN = 7168
EPS = 1e-6
TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Workload:
    """What the describers declare for: the captured decode batch sizes."""

    token_counts: tuple[int, ...]
    stage: str = "weights"


class DecoderLayer:
    """The collectives of one decoder layer: the attention output's all-reduce and
    the MoE output's all-reduce fused with the next residual add + RMSNorm."""

    def __init__(self, index: int, invocation: type[Invocation]) -> None:
        self.index = index
        self.norm_weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
        self._invocation = invocation

    def describe(self, workload: Workload) -> list[Invocation]:
        out = []
        for rows in workload.token_counts:
            out.append(
                self._invocation(
                    name=f"layers.{self.index}.attn_output_all_reduce.m{rows}",
                    operation=PLAIN,
                    shape=(rows, HIDDEN),
                    dtype=torch.bfloat16,
                )
            )
            out.append(
                self._invocation(
                    name=f"layers.{self.index}.moe_output_add_rms_norm.m{rows}",
                    operation=FUSED,
                    shape=(rows, HIDDEN),
                    dtype=torch.bfloat16,
                    norm_weight=self.norm_weight,
                    epsilon=EPS,
                )
            )
        return out


def lookup_step(world_size: int = 8) -> StepResult:
    name, where = "all-reduce: declared lookups (adapter)", "cpu"
    try:
        from b12x.comm.pcie import DeclaredPlanIndex, Invocation, route  # noqa: F401
    except ImportError as e:
        return StepResult(
            name,
            where,
            f"skipped: the declared-plan index is not in this build ({e})",
            status="skip",
        )
    from b12x.integration.vllm import PcieAllReduce

    comm = PcieAllReduce(world_size=world_size, device="cpu", env={})  # default limits
    layers = [DecoderLayer(i, Invocation) for i in range(LAYERS)]
    for layer in layers:
        comm.register_describer(layer, layer.describe)
    routes = comm.prepare(Workload(TOKEN_COUNTS))
    declared = 2 * LAYERS * len(TOKEN_COUNTS)

    def x(rows: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.empty((rows, HIDDEN), dtype=dtype)

    def routed(kind: str) -> list[int]:
        return [r for r in TOKEN_COUNTS if f"layers.0.{kind}.m{r}" in routes]

    plain_rows, fused_rows = routed("attn_output_all_reduce"), routed("moe_output_add_rms_norm")
    weight = layers[0].norm_weight
    has_plan_for = comm.plans.has_plan_for
    hits = [has_plan_for(x(r)) for r in plain_rows]
    hits += [has_plan_for(x(r), FUSED, lay.norm_weight, EPS) for lay in layers for r in fused_rows]
    misses = [has_plan_for(x(r)) for r in (3, 5)]  # never declared
    misses += [has_plan_for(x(r)) for r in TOKEN_COUNTS if r not in plain_rows]
    misses += [has_plan_for(x(r), FUSED, weight, EPS) for r in TOKEN_COUNTS if r not in fused_rows]
    misses.append(has_plan_for(x(1, torch.float32)))  # another dtype
    misses.append(has_plan_for(x(1), FUSED, weight.clone(), EPS))  # equal value, other object
    probe_hit, probe_miss = x(plain_rows[-1] if plain_rows else 1), x(3)
    number = 20000
    hit_s = min(timeit.repeat(lambda: has_plan_for(probe_hit), number=number, repeat=3))
    miss_s = min(timeit.repeat(lambda: has_plan_for(probe_miss), number=number, repeat=3))
    ok = all(hits) and not any(misses) and not comm.should_custom_ar(probe_hit)
    by_route = Counter(routes.values())
    summary = (
        f"TP{world_size}, {LAYERS} layers x {{all-reduce, fused add+RMSNorm}} x rows "
        f"{TOKEN_COUNTS}: {len(routes)}/{declared} routed "
        f"({', '.join(f'{n} {name}' for name, n in sorted(by_route.items()))}), "
        f"{len(comm.plans)} index keys; hits {sum(hits)}/{len(hits)}, "
        f"misses {len(misses) - sum(misses)}/{len(misses)}; no runtime here, so every live "
        "call declines to NCCL"
    )
    timing = f"{hit_s / number * 1e6:.2f}/{miss_s / number * 1e6:.2f} us hit/miss"
    return StepResult(name, where, summary, timing, "ok" if ok else "FAIL")
