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
