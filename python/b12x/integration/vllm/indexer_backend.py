"""vLLM classes that run DeepSeek V3.2 / V4 sparse indexing through b12x.

Importing this module imports vLLM (:mod:`~b12x.integration.vllm.indexer_hooks`
imports it inside ``install()`` only). Everything here subclasses vLLM's own
classes and plugs into the seams vLLM's models already have:

* **DeepSeek V4** asks ``DeepseekV4Attention._get_indexer_cls(vllm_config)``
  for its indexer; :class:`B12xDeepseekV4Indexer` returns
  :class:`~b12x.integration.vllm.indexer.C4SparseIndexer` from
  ``_get_attn_cls`` and :class:`B12xDeepseekV4IndexerCache` from
  ``_get_cache_cls``.
* **DeepSeek V3.2 / GLM DSA** build ``DeepseekV32Attention.indexer_cls`` and
  then, inside it, vLLM's ``SparseAttnIndexer`` custom op; the attention calls
  ``sparse_attn_indexer`` of ``vllm.models.deepseek_v32.attention`` directly.
  :class:`B12xSparseAttnIndexer` is registered out of tree in its place
  (``CustomOp.register_oot``): b12x's op for a b12x cache, vLLM's own for
  every other (which also keeps vLLM's DeepGEMM requirement away from b12x
  layers); :func:`make_v32_dispatcher` hands a layer b12x owns to its op and
  every other call to vLLM's function.
* Each cache names its backend (``get_attn_backend``), each backend its
  metadata builder: :class:`B12xIndexerMetadataBuilder` is vLLM's builder
  with decode rows flattened to one row per token (graph-capturable for any
  batch) and one request per prefill chunk, the layout b12x runs directly.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from vllm.model_executor.custom_op import CustomOp
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.model_executor.models.deepseek_v2 import DeepseekV32IndexerCache
from vllm.models.deepseek_v4.attention import DeepseekV4Indexer, DeepseekV4IndexerCache
from vllm.models.deepseek_v32.attention import DeepseekV32Indexer
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.mla.indexer import (
    DeepseekV4IndexerBackend,
    DeepseekV32IndexerBackend,
    DeepseekV32IndexerMetadataBuilder,
)

from b12x.integration.vllm.indexer import C4SparseIndexer

__all__ = [
    "B12xDeepseekV4Indexer",
    "B12xDeepseekV4IndexerBackend",
    "B12xDeepseekV4IndexerCache",
    "B12xDeepseekV32Indexer",
    "B12xDeepseekV32IndexerBackend",
    "B12xDeepseekV32IndexerCache",
    "B12xIndexerMetadataBuilder",
    "B12xSparseAttnIndexer",
    "make_v4_indexer_cls",
    "make_v32_dispatcher",
    "make_v32_indexer_cls",
    "v32_ops",
]


class B12xIndexerMetadataBuilder(DeepseekV32IndexerMetadataBuilder):
    """vLLM's indexer metadata in the layout b12x runs without conversion.

    * Decode is flattened (one row per token, expanded page table, never
      ``requires_padding``), so every decode batch can be captured in a full
      CUDA graph: support ``ALWAYS``.
    * Each prefill request is its own chunk, all of its query rows at once:
      b12x's prefill route shares one page-table row over a chunk's rows, and
      its scratch is bounded by its top-k chunking, not by DeepGEMM's
      ``rows x keys`` logits budget that vLLM's chunker sizes for.
    """

    @classmethod
    def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
        return AttentionCGSupport.ALWAYS

    def __init__(self, *args: Any, block_table_width: int, **kwargs: Any) -> None:
        super().__init__(*args, block_table_width=block_table_width, **kwargs)
        self.use_flattening = True
        self.supports_varlen = False

    @staticmethod
    def _split_indexer_prefill_chunks(
        compressed_seq_lens_cpu: torch.Tensor,
        prefill_query_lens_cpu: torch.Tensor,
        workspace_size: int,
        max_logits_bytes: int,
        request_offset: int = 0,
    ) -> list[tuple[slice, slice]]:
        del compressed_seq_lens_cpu, workspace_size, max_logits_bytes
        return [
            (slice(request_offset + i, request_offset + i + 1), slice(0, int(rows)))
            for i, rows in enumerate(prefill_query_lens_cpu.tolist())
        ]


class _B12xBackend:
    """What b12x's indexer backends change in vLLM's: b12x's metadata builder,
    no PCP, and host query lengths that match the device's (b12x declines
    configs with context parallelism or adaptive verification)."""

    @classmethod
    def supports_pcp(cls) -> bool:
        return False

    @classmethod
    def supports_device_cpu_query_lens_mismatch(cls) -> bool:
        return False

    @staticmethod
    def get_builder_cls() -> type[B12xIndexerMetadataBuilder]:
        return B12xIndexerMetadataBuilder


class B12xDeepseekV4IndexerBackend(_B12xBackend, DeepseekV4IndexerBackend):
    """DeepSeek V4's indexer backend with b12x's metadata builder."""

    @staticmethod
    def get_name() -> str:
        return "DEEPSEEK_V4_B12X_INDEXER"


class B12xDeepseekV32IndexerBackend(_B12xBackend, DeepseekV32IndexerBackend):
    """DeepSeek V3.2's indexer backend with b12x's metadata builder."""

    @staticmethod
    def get_name() -> str:
        return "DEEPSEEK_V32_B12X_INDEXER"


class B12xDeepseekV4IndexerCache(DeepseekV4IndexerCache):
    """DeepSeek V4's index K cache (same layout), served by b12x's backend."""

    def get_attn_backend(self) -> type[B12xDeepseekV4IndexerBackend]:
        return B12xDeepseekV4IndexerBackend


class B12xDeepseekV32IndexerCache(DeepseekV32IndexerCache):
    """DeepSeek V3.2's index K cache (same layout), served by b12x's backend."""

    def get_attn_backend(self) -> type[B12xDeepseekV32IndexerBackend]:
        return B12xDeepseekV32IndexerBackend


class B12xDeepseekV4Indexer(DeepseekV4Indexer):
    """DeepSeek V4's indexer with b12x's cache backend and top-k op."""

    def _get_cache_cls(self) -> type[B12xDeepseekV4IndexerCache]:
        return B12xDeepseekV4IndexerCache

    def _get_attn_cls(self) -> type[C4SparseIndexer]:
        return C4SparseIndexer


class B12xDeepseekV32Indexer(DeepseekV32Indexer):
    """DeepSeek V3.2's indexer with b12x's cache backend; its op comes from
    :class:`B12xSparseAttnIndexer` (registered out of tree as ``SparseAttnIndexer``)."""

    indexer_cache_cls = B12xDeepseekV32IndexerCache


_V32_OPS: weakref.WeakValueDictionary[str, C4SparseIndexer] = weakref.WeakValueDictionary()


def v32_ops() -> dict[str, C4SparseIndexer]:
    """The live V3.2 layers b12x serves, by index-cache prefix."""
    return dict(_V32_OPS)


def make_v4_indexer_cls(
    vllm_method: Callable[[Any, Any], type], accept: Callable[[Any], bool]
) -> Callable[[Any, Any], type]:
    """``DeepseekV4Attention._get_indexer_cls``: b12x's indexer where ``accept(vllm_config)``."""

    def _get_indexer_cls(attention: Any, vllm_config: Any) -> type:
        if accept(vllm_config):
            return B12xDeepseekV4Indexer
        return vllm_method(attention, vllm_config)

    return _get_indexer_cls


def make_v32_indexer_cls(vllm_cls: type, accept: Callable[[Any], bool]) -> Callable[..., Any]:
    """``DeepseekV32Attention.indexer_cls``, called as ``indexer_cls(vllm_config, ...)``:
    b12x's indexer where ``accept(vllm_config)``, vLLM's otherwise."""

    def indexer_cls(vllm_config: Any, *args: Any, **kwargs: Any) -> Any:
        cls = B12xDeepseekV32Indexer if accept(vllm_config) else vllm_cls
        return cls(vllm_config, *args, **kwargs)

    return indexer_cls


class B12xSparseAttnIndexer(SparseAttnIndexer):
    """vLLM's ``SparseAttnIndexer`` as b12x registers it out of tree.

    Built with vLLM's arguments (``k_cache, quant_block_size, scale_fmt,
    topk_tokens, head_dim, max_model_len, max_total_seq_len,
    topk_indices_buffer, ...``). For a b12x index cache it holds b12x's op
    (``self.b12x``, a :class:`C4SparseIndexer`; V3.2's fused kernel writes the
    index K cache itself and its K rows are tokens, ``compress_ratio=1``) and
    never runs vLLM's set-up (which needs DeepGEMM); for any other cache it is
    exactly vLLM's own op.
    """

    def __init__(self, k_cache: Any, *args: Any, **kwargs: Any) -> None:
        self.b12x: C4SparseIndexer | None = None
        if not isinstance(k_cache, B12xDeepseekV32IndexerCache):
            super().__init__(k_cache, *args, **kwargs)
            return
        CustomOp.__init__(self)
        self.k_cache = k_cache
        self.topk_backend = C4SparseIndexer.topk_backend  # V3.2's attention passes it on
        options = {"skip_k_cache_insert": True, "compress_ratio": 1, **kwargs}
        self.b12x = C4SparseIndexer(k_cache, *args, **options)
        _V32_OPS[str(k_cache.prefix)] = self.b12x

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.b12x is not None:
            return self.b12x(*args, **kwargs)
        return super().forward(*args, **kwargs)


def make_v32_dispatcher(vllm_fn: Callable[..., Any]) -> Callable[..., Any]:
    """The V3.2 module's ``sparse_attn_indexer``: b12x's op for layers it owns.

    vLLM's signature starts ``(hidden_states, k_cache_prefix, kv_cache,
    q_quant, q_scale, k, weights, ...)``; a layer b12x owns has an FP8 query
    (no ``q_scale``) and its K already in the cache (no ``k``).
    """

    def sparse_attn_indexer(
        hidden_states: torch.Tensor,
        k_cache_prefix: Any,
        kv_cache: torch.Tensor,
        q_quant: torch.Tensor,
        q_scale: torch.Tensor | None,
        k: torch.Tensor | None,
        weights: torch.Tensor,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        op = _V32_OPS.get(k_cache_prefix) if isinstance(k_cache_prefix, str) else None
        if op is None or q_scale is not None or k is not None:
            head = (hidden_states, k_cache_prefix, kv_cache, q_quant, q_scale, k, weights)
            return vllm_fn(*head, *args, **kwargs)
        return op(hidden_states, q_quant, None, weights)

    return sparse_attn_indexer
