"""Declared all-reduce plans of the miniature model, and live lookups through the
adapter: what a TP rank decides for every all-reduce without any GPU."""

from __future__ import annotations

import timeit
from dataclasses import dataclass

import torch

from b12x._demo import StepResult

LAYERS = 61  # DeepSeek V4's layer count
HIDDEN = 7168
EPS = 1e-6
TOKEN_COUNTS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class Workload:
    """What the describers declare for: the captured decode batch sizes."""

    token_counts: tuple[int, ...]
    stage: str = "weights"


class DecoderLayer:
    """The collectives of one decoder layer: the attention output's all-reduce and
    the MoE output's all-reduce fused with the next residual add + RMSNorm."""

    def __init__(self, index: int, invocation: type) -> None:
        self.index = index
        self.norm_weight = torch.ones(HIDDEN, dtype=torch.bfloat16)
        self._invocation = invocation

    def describe(self, workload: Workload) -> list:
        out = []
        for rows in workload.token_counts:
            out.append(
                self._invocation(
                    name=f"layers.{self.index}.attn_output_all_reduce.m{rows}",
                    operation="all_reduce",
                    shape=(rows, HIDDEN),
                    dtype=torch.bfloat16,
                )
            )
            out.append(
                self._invocation(
                    name=f"layers.{self.index}.moe_output_add_rms_norm.m{rows}",
                    operation="all_reduce_fused_add_rms_norm",
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
        from b12x.comm.pcie import Invocation
    except ImportError as e:
        return StepResult(
            name, where, f"skipped: b12x.comm.pcie is not in this build ({e})", status="skip"
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

    routed_rows = sorted({int(n.rsplit(".m", 1)[1]) for n in routes})
    hits = [comm.has_plan_for(x(r)) for r in routed_rows]
    hits += [
        comm.has_plan_for(x(r), "all_reduce_fused_add_rms_norm", layer.norm_weight, EPS)
        for layer in layers
        for r in routed_rows
    ]
    over = [r for r in TOKEN_COUNTS if r not in routed_rows]
    misses = [comm.has_plan_for(x(r)) for r in (3, 5, *over)]  # undeclared; over the ceiling
    misses.append(comm.has_plan_for(x(1, torch.float32)))  # another dtype
    clone = layers[0].norm_weight.clone()  # equal value, another object
    misses.append(comm.has_plan_for(x(1), "all_reduce_fused_add_rms_norm", clone, EPS))
    probe_hit, probe_miss = x(routed_rows[-1]) if routed_rows else x(1), x(3)
    number = 20000
    hit_us = min(timeit.repeat(lambda: comm.has_plan_for(probe_hit), number=number, repeat=3))
    miss_us = min(timeit.repeat(lambda: comm.has_plan_for(probe_miss), number=number, repeat=3))
    hit_us, miss_us = hit_us / number * 1e6, miss_us / number * 1e6
    ok = all(hits) and not any(misses) and comm.should_custom_ar(probe_hit) is False
    summary = (
        f"TP{world_size}, {LAYERS} layers x {{all-reduce, fused add+RMSNorm}} x rows "
        f"{TOKEN_COUNTS}: {len(routes)}/{declared} routed (ceiling 84KB: rows {routed_rows}), "
        f"{len(comm._index)} index keys; hits {sum(hits)}/{len(hits)}, "
        f"misses {len(misses) - sum(misses)}/{len(misses)}; no runtime here, so every live "
        f"call declines to NCCL"
    )
    return StepResult(
        name,
        where,
        summary,
        f"{hit_us:.2f}/{miss_us:.2f} us hit/miss",
        "ok" if ok else "FAIL",
    )
