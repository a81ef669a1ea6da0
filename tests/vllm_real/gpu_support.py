"""Helpers for the ``test_gpu_*`` files: the real vLLM 0.33 on its CUDA platform, b12x's kernels.

They run where vLLM's platform is CUDA (``VLLM_TARGET_DEVICE=cuda`` on a GPU host:
tools/gpu/vllm_real.sh) and skip everywhere else. Everything that
:mod:`indexer_support` builds on the CPU is built here on ``cuda:0``: vLLM's
index-cache layers bound to a packed CUDA allocation, its metadata builders'
persistent buffers and Triton kernels, its ``WorkspaceManager``. References
are vLLM's own: ``fp8_paged_mqa_logits_torch`` on the GPU, and DeepGEMM's
paged logits through vLLM's wrapper where DeepGEMM imports.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import indexer_support as s
import pytest
import torch
from b12x.integration.vllm.indexer import C4SparseIndexer
from vllm.config import set_current_vllm_config
from vllm.v1.worker import workspace

DEVICE = torch.device("cuda", 0)
CAPTURE_SIZES = [4, 8]  # FULL decode graphs of 4 and 8 tokens
# vLLM's padding for a request past the batch (gpu_model_runner): its block-table
# rows point at block 0, the null block
NULL_BLOCK_ID = 0
PAD_SLOT_ID = -1


def cuda_platform_reason() -> str | None:
    """Why these tests cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    from vllm.platforms import current_platform

    if not current_platform.is_cuda():
        return (
            f"vLLM's platform is {current_platform.device_name!r}: these run on its CUDA "
            "platform (VLLM_TARGET_DEVICE=cuda on a GPU host, tools/gpu/vllm_real.sh)"
        )
    from b12x.attention import dsa_indexer

    if not dsa_indexer.is_supported(DEVICE):
        return "the b12x indexer kernels do not run on cuda:0"
    return None


@pytest.fixture
def on_cuda():
    """Skips unless vLLM runs on its CUDA platform with a GPU b12x's kernels run on."""
    reason = cuda_platform_reason()
    if reason is not None:
        pytest.skip(reason)


def deep_gemm_module() -> Any:
    """DeepGEMM as vLLM resolves it (``deep_gemm``, then its vendored copy), or None."""
    from vllm.utils.deep_gemm import _import_deep_gemm

    return _import_deep_gemm()


@pytest.fixture
def vllm_deep_gemm(monkeypatch):
    """Where DeepGEMM does not import, vLLM's indexer builder is told so.

    vLLM finds DeepGEMM by module spec (``has_deep_gemm()``); a vLLM tree
    carried without DeepGEMM's extension still has the vendored package's
    files, and its builder would then call a missing kernel. Without the
    DeepGEMM peer the builder skips DeepGEMM's schedule (b12x ignores it).
    Yields the module, or None.
    """
    module = deep_gemm_module()
    if module is None:
        from vllm.v1.attention.backends.mla import indexer

        monkeypatch.setattr(indexer, "has_deep_gemm", lambda: False)
    return module


# --- caches, metadata and the op on CUDA ----------------------------------------------------


def bind_packed_caches(layers: Sequence[Any], config: Any, num_blocks: int) -> None:
    """:func:`indexer_support.bind_packed_caches` on ``cuda:0``: block-outermost
    views of one CUDA allocation, vLLM's allocator layout, every byte random."""
    s.bind_packed_caches(layers, config, num_blocks, device=DEVICE)


def on_device(common: Any) -> Any:
    """vLLM's per-batch metadata with its device tensors on ``cuda:0`` (the ``*_cpu``
    and host-bound fields stay on the host, as vLLM's runner keeps them)."""
    moved = {
        name: getattr(common, name).to(DEVICE)
        for name in ("query_start_loc", "seq_lens", "block_table_tensor", "slot_mapping")
    }
    if common.positions is not None:
        moved["positions"] = common.positions.to(DEVICE)
    return dataclasses.replace(common, **moved)


def padded_for_graph(common: Any, num_reqs: int, num_tokens: int) -> Any:
    """The batch padded the way vLLM's runner pads it for a FULL CUDA graph of
    ``num_reqs`` requests and ``num_tokens`` tokens: padding requests with no
    tokens (``query_start_loc`` repeats its end), ``seq_len`` 0 and null-block
    table rows; ``num_actual_tokens`` is the padded count."""
    pad_reqs = num_reqs - common.num_reqs
    pad_tokens = num_tokens - int(common.query_start_loc_cpu[-1])
    assert pad_reqs >= 0 and pad_tokens >= 0, (pad_reqs, pad_tokens)

    def grow(t: torch.Tensor, n: int, value: int) -> torch.Tensor:
        fill = torch.full((n, *t.shape[1:]), value, dtype=t.dtype, device=t.device)
        return torch.cat([t, fill])

    def repeat_end(t: torch.Tensor) -> torch.Tensor:
        return torch.cat([t, t[-1:].repeat(pad_reqs)])

    return dataclasses.replace(
        common,
        query_start_loc=repeat_end(common.query_start_loc),
        query_start_loc_cpu=repeat_end(common.query_start_loc_cpu),
        seq_lens=grow(common.seq_lens, pad_reqs, 0),
        seq_lens_cpu_upper_bound=grow(common.seq_lens_cpu_upper_bound, pad_reqs, 0),
        block_table_tensor=grow(common.block_table_tensor, pad_reqs, NULL_BLOCK_ID),
        slot_mapping=grow(common.slot_mapping, pad_tokens, PAD_SLOT_ID),
        positions=grow(common.positions, pad_tokens, 0),
        num_reqs=num_reqs,
        num_actual_tokens=num_tokens,
    )


def full_decode_dispatcher(config: Any, depth: int) -> Any:
    """vLLM's ``CudagraphDispatcher`` with FULL decode graphs at :data:`CAPTURE_SIZES`
    tokens, ``depth`` tokens per request (1 + speculative tokens)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

    compilation = config.compilation_config
    compilation.cudagraph_mode = CUDAGraphMode.FULL_DECODE_ONLY
    compilation.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    compilation.max_cudagraph_capture_size = max(CAPTURE_SIZES)
    dispatcher = CudagraphDispatcher(config)
    dispatcher.initialize_cudagraph_keys(
        CUDAGraphMode.FULL_DECODE_ONLY, uniform_decode_query_len=depth
    )
    return dispatcher


def queries(tokens: int, seed: int, heads: int = s.HEADS) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`indexer_support.queries` on ``cuda:0``; ``heads`` other than its 16 for
    DeepGEMM, whose logits kernels take 32 or 64 heads (DeepSeek's indexer has 64)."""
    if heads == s.HEADS:
        q, w = s.queries(tokens, seed)
    else:
        gen = torch.Generator().manual_seed(seed)
        q = torch.randn((tokens, heads, 128), generator=gen).to(torch.float8_e4m3fn)
        w = torch.rand((tokens, heads), generator=gen)
    return q.to(DEVICE), w.to(DEVICE)


class V4Model:
    """Two DeepSeek V4 C4 layers' index caches in one packed CUDA allocation,
    and b12x's op on the first (as :mod:`test_indexer_metadata`'s model, on CUDA)."""

    def __init__(self, speculative_tokens: int = 0, num_blocks: int = 256,
                 max_model_len: int = 16384) -> None:  # fmt: skip
        self.config = s.make_config(
            max_model_len=max_model_len, speculative_tokens=speculative_tokens
        )
        self.width = max_model_len // s.V4_BLOCK
        self.layers = s.index_cache_layers(
            _v4_cache_cls(),
            self.config,
            ["model.layers.0.attn.indexer.k_cache", "model.layers.1.attn.indexer.k_cache"],
            compress_ratio=4,
        )
        self.num_blocks = num_blocks
        bind_packed_caches(self.layers, self.config, num_blocks)
        for i, layer in enumerate(self.layers):
            s.fill_index_cache(layer.kv_cache, seed=10 + i)  # packed on the host, copied in
        rows = self.config.scheduler_config.max_num_batched_tokens
        self.buffer = torch.full((rows, s.TOPK), -9, dtype=torch.int32, device=DEVICE)
        self.op = C4SparseIndexer(
            self.layers[0], 128, "ue8m0", s.TOPK, 128, max_model_len // 4, 0, self.buffer,
            skip_k_cache_insert=True, compress_ratio=4,
        )  # fmt: skip

    @property
    def cache(self) -> torch.Tensor:
        return self.layers[0].kv_cache

    @property
    def prefix(self) -> str:
        return self.layers[0].prefix

    def builder(self, cls: type) -> Any:
        spec = self.layers[0].get_kv_cache_spec(self.config)
        with set_current_vllm_config(self.config):
            return cls(spec, [self.prefix], self.config, DEVICE, block_table_width=self.width)

    def table(self, requests: Sequence[s.Request], seed: int) -> torch.Tensor:
        return s.block_table(requests, s.V4_BLOCK, self.width, self.num_blocks, seed=seed)

    def common(self, requests: Sequence[s.Request], table: torch.Tensor) -> Any:
        return on_device(s.common_metadata(requests, table, s.V4_BLOCK))


def _v4_cache_cls() -> type:
    from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache

    return DeepseekV4IndexerCache


@contextlib.contextmanager
def workspace_manager() -> Iterator[workspace.WorkspaceManager]:
    """vLLM's global workspace manager on ``cuda:0``, for one test."""
    workspace.init_workspace_manager(DEVICE)
    try:
        yield workspace.current_workspace_manager()
    finally:
        workspace.reset_workspace_manager()


# --- references ----------------------------------------------------------------------------


def vllm_logits(
    q: torch.Tensor,
    w: torch.Tensor,
    cache: torch.Tensor,
    table: torch.Tensor,
    rows: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """vLLM's PyTorch paged-MQA logits on the GPU, one query row per token."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

    owners = torch.tensor([r for r, _ in rows], dtype=torch.int64, device=DEVICE)
    lengths = torch.tensor([n for _, n in rows], dtype=torch.int32, device=DEVICE)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # a float32 reference: no TF32 on the GPU
    try:
        return fp8_paged_mqa_logits_torch(
            q[:, None],
            cache.contiguous(),  # its reference views pages densely; the bytes are the same
            w,
            lengths,
            table.to(DEVICE).index_select(0, owners),
            table.shape[1] * s.PAGE,
        )
    finally:
        torch.set_float32_matmul_precision(previous)


def deepgemm_decode_logits(metadata: Any, q: torch.Tensor, w: torch.Tensor, cache: torch.Tensor,
                           max_model_len: int) -> torch.Tensor:  # fmt: skip
    """DeepGEMM's decode logits for vLLM's stock (native) decode metadata, called
    as vLLM's ``sparse_attn_indexer`` calls it for an unpadded uniform batch:
    row ``b * next_n + j`` is token ``j`` of request ``b``."""
    from vllm.model_executor.layers.sparse_attn_indexer import kv_cache_as_quant_view
    from vllm.utils.deep_gemm import fp8_fp4_paged_mqa_logits

    decode = metadata.decode
    batch = int(decode.seq_lens.shape[0])
    tokens = int(metadata.num_decode_tokens)
    assert not decode.requires_padding and tokens % batch == 0
    q4 = q[:tokens].reshape(batch, tokens // batch, *q.shape[1:])
    return fp8_fp4_paged_mqa_logits(
        (q4, None),
        kv_cache_as_quant_view(cache, 128, False),
        w[:tokens],
        decode.seq_lens,
        decode.block_table,
        decode.schedule_metadata,
        max_model_len=max_model_len,
        indices=decode.indices,
    )


def assert_near_top_k(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: Sequence[tuple[int, int]],
    rel_tol: float,
    topk: int = s.TOPK,
) -> None:
    """Each row of ``out`` is a top-k of ``logits`` up to ties within ``rel_tol``
    of the row's largest magnitude (DeepGEMM accumulates in FP8): ``min(topk,
    visible)`` distinct visible indices, none below the k-th value by more than
    that, and ``-1`` in every other slot."""
    for t, (_, visible) in enumerate(rows):
        want = min(topk, visible)
        chosen = out[t][out[t] >= 0].to(torch.int64)
        assert int((out[t] == -1).sum()) == topk - want, f"row {t}: -1 slots"
        assert chosen.numel() == want and chosen.unique().numel() == want, f"row {t}: count"
        if want == 0:
            continue
        assert int(chosen.max()) < visible, f"row {t}: an index past {visible}"
        row = logits[t, :visible].float()
        kth = row.topk(want).values[-1]
        slack = rel_tol * row.abs().max()
        worst = row[chosen].min()
        assert worst >= kth - slack, f"row {t}: selected {worst} below the k-th {kth} - {slack}"
