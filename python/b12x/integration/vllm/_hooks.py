"""The few vLLM services the adapters use, looked up lazily.

vLLM is imported inside each function, never at module import, so the
adapters import (and are tested) without vLLM. Tests replace these functions
with fakes (``monkeypatch.setattr(_hooks, "workspace_manager", ...)``).
"""

from __future__ import annotations

from typing import Any


def workspace_manager() -> Any:
    """vLLM's shared workspace manager (has ``get_simultaneous(*shapes_and_dtypes)``)."""
    from vllm.v1.worker.workspace import current_workspace_manager

    return current_workspace_manager()


def forward_context() -> Any:
    """vLLM's forward context (``attn_metadata``, ``cudagraph_runtime_mode``, ...)."""
    from vllm.forward_context import get_forward_context

    return get_forward_context()


def is_eager_mode(mode: Any) -> bool:
    """True for vLLM's ``CUDAGraphMode.NONE`` (or a fake spelled ``"NONE"``)."""
    return getattr(mode, "name", mode) == "NONE"


def vllm_config() -> Any:
    """vLLM's current config (set while vLLM builds workers and models), or None."""
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def same_node(group: Any) -> bool:
    """Whether every rank of ``group`` (a CPU group) runs on this node; collective."""
    from vllm.distributed.parallel_state import in_the_same_node_as

    return all(in_the_same_node_as(group, source_rank=0))


def tp_custom_allreduce() -> Any:
    """The TP group's custom all-reduce slot (``CudaCommunicator.ca_comm``), or None."""
    from vllm.distributed.parallel_state import get_tp_group, model_parallel_is_initialized

    if not model_parallel_is_initialized():
        return None
    return getattr(get_tp_group().device_communicator, "ca_comm", None)


def tp_all_reduce(x: Any) -> Any:
    """vLLM's TP all-reduce of ``x`` (its whole backend chain)."""
    from vllm.distributed import tensor_model_parallel_all_reduce

    return tensor_model_parallel_all_reduce(x)


def fused_add_rms_norm(x: Any, residual: Any, weight: Any, epsilon: float) -> Any:
    """vLLM's own ``fused_add_rms_norm`` (IR op): ``(normed, x + residual)``."""
    from vllm import ir

    return ir.ops.fused_add_rms_norm(x, residual, weight, epsilon)


def flashinfer_all_reduce_first() -> bool:
    """Whether vLLM's FlashInfer all-reduce is on; it comes before ``ca_comm`` in vLLM's chain."""
    import vllm.envs as envs
    from vllm.distributed.device_communicators.flashinfer_all_reduce import fi_ar_available

    return bool(fi_ar_available and envs.VLLM_ALLREDUCE_USE_FLASHINFER)
