"""``torch.ops.b12x.fused_all_reduce_add_rms_norm``: the fused op as vLLM code reaches it.

``normed = fused_all_reduce_add_rms_norm(x, residual, weight, epsilon)``
all-reduces ``x`` (a row-parallel layer's partial sum) over vLLM's TP group,
adds it to ``residual`` in place, and returns the RMSNorm of the sum times
``weight``: what ``tensor_model_parallel_all_reduce`` followed by vLLM's
``fused_add_rms_norm`` computes, in one kernel when b12x's TP slot takes it
(:meth:`~b12x.integration.vllm.communicator.B12xCustomAllreduce.try_fused_add_rms_norm`),
else through exactly those two vLLM calls.

It is a torch custom op with a fake implementation, so ``torch.compile``
traces it as one node (vLLM compiles its models), and it is safe inside a
CUDA graph capture: the choice between the two paths is made on the host and
is the same on every rank. Gate on the TP slot's
``supports_fused_add_rms_norm()`` (the probe the fork checks) or call it
unconditionally: without b12x it is the unfused vLLM sequence.
"""

from __future__ import annotations

import torch

from b12x.integration.vllm import _hooks
from b12x.integration.vllm.communicator import B12xCustomAllreduce

__all__ = ["fused_all_reduce_add_rms_norm", "supports_fused_add_rms_norm"]


@torch.library.custom_op("b12x::fused_all_reduce_add_rms_norm", mutates_args=("residual",))
def fused_all_reduce_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> torch.Tensor:
    """``residual += all_reduce(x)``; returns ``rms_norm(residual) * weight``."""
    slot = _hooks.tp_custom_allreduce()
    if isinstance(slot, B12xCustomAllreduce) and slot.supports_fused_add_rms_norm():
        out = torch.empty_like(x)
        if slot.try_fused_add_rms_norm(x, residual, weight, epsilon, out):
            return out
    reduced = _hooks.tp_all_reduce(x)
    normed, summed = _hooks.fused_add_rms_norm(reduced, residual, weight, epsilon)
    if summed.data_ptr() != residual.data_ptr():
        residual.copy_(summed)
    if normed.data_ptr() == x.data_ptr():  # a custom op's output may not alias its input
        normed = normed.clone()
    return normed


@fused_all_reduce_add_rms_norm.register_fake
def _(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, epsilon: float
) -> torch.Tensor:
    return torch.empty_like(x)


def supports_fused_add_rms_norm() -> bool:
    """Whether vLLM's TP group can run the fused op on b12x (False outside vLLM's TP)."""
    slot = _hooks.tp_custom_allreduce()
    return isinstance(slot, B12xCustomAllreduce) and slot.supports_fused_add_rms_norm()
