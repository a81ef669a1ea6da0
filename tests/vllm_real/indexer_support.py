"""Helpers for the indexer tests against the real vLLM 0.33, on CPU.

vLLM's own code builds everything: the config, the index K caches (its
``DeepseekV4IndexerCache`` / ``DeepseekV32IndexerCache`` layers, viewed by its
KV-cache allocator code, packed layouts included), the metadata (its
builders and dataclasses), the forward context and the workspace manager.
b12x runs its CPU path on CPU tensors; results are compared with vLLM's own
PyTorch reference (``fp8_paged_mqa_logits_torch``, then ``torch.topk``).

One thing is replaced, and only without a GPU: vLLM then has no Triton
(``vllm.triton_utils.HAS_TRITON`` is False), so the three small Triton kernels
its indexer builder launches (compressed slot mapping, uniform decode
expansion, prefill chunk bounds) run as the PyTorch transcriptions below.
With Triton present vLLM's kernels run.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from b12x.attention.dsa_indexer import reference
from b12x.integration.vllm.indexer import flatten_index_cache

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # as conftest.py: vLLM's CPU platform
with warnings.catch_warnings():  # what vLLM's dependencies warn about at import is theirs
    warnings.simplefilter("ignore")
    pytest.importorskip("vllm")
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.forward_context import set_forward_context
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import KVCacheTensor, create_kv_cache_views
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker import workspace

PAGE = 64  # K rows per index-cache page
HEADS = 16
TOPK = 512
V4_BLOCK = 256  # tokens per V4 block: 64 compressed rows
V32_BLOCK = 64  # tokens per V3.2 block: 64 rows


# --- config --------------------------------------------------------------------------------


def make_config(
    *,
    max_model_len: int = 16384,
    block_size: int = V4_BLOCK,
    speculative_tokens: int = 0,
    max_num_batched_tokens: int = 2048,
) -> VllmConfig:
    """A real ``VllmConfig`` for a DeepSeek sparse-attention model.

    The model config is the few fields vLLM's indexer code reads (a real one
    needs the checkpoint's files).
    """
    config = VllmConfig()
    hf = SimpleNamespace(
        index_topk=TOPK,
        index_n_heads=HEADS,
        index_head_dim=128,
        qk_rope_head_dim=64,
        rms_norm_eps=1e-6,
    )
    config.model_config = SimpleNamespace(
        max_model_len=max_model_len,
        architectures=["DeepseekV4ForCausalLM"],
        is_moe=False,
        hf_config=hf,
        hf_text_config=hf,
    )
    config.cache_config.block_size = block_size
    config.attention_config.sparse_mla_prefill_workspace_factor = 5
    config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    if speculative_tokens:
        config.speculative_config = SimpleNamespace(
            num_speculative_tokens=speculative_tokens, enable_adaptive_verification=False
        )
    return config


# --- vLLM's Triton kernels, transcribed (CPU only) ------------------------------------------


def _compressed_slot_mapping(
    out, slot_mapping, query_start_loc, seq_lens, block_table, block_size, ratio, dcp, interleave
):
    assert dcp == 1
    for b in range(block_table.shape[0]):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        pos = int(seq_lens[b]) - (q1 - q0) + torch.arange(q1 - q0)
        slot = slot_mapping[q0:q1]
        valid = ((pos + 1) % ratio == 0) & (slot != -1)
        state = pos // ratio
        ids = block_table[b, (state // block_size).clamp(max=block_table.shape[1] - 1)]
        slots = ids.to(torch.int64) * block_size + state % block_size
        out[q0:q1] = torch.where(valid, slots, torch.full_like(slots, -1))


def _uniform_decode(seq_lens, decode_seq_lens, block_table, expanded, decode_lens, tokens, depth):
    idx = torch.arange(tokens)
    req, local = idx // depth, idx % depth
    decode_seq_lens[:tokens] = (seq_lens[req] - depth + local + 1).clamp(min=0)
    width = min(block_table.shape[1], expanded.shape[1])
    expanded[:tokens, :width] = block_table[req, :width]
    decode_lens[:tokens] = 1


def _prefill_chunk_bounds(
    query_start_loc,
    uncompressed_seq_lens,
    cu_seq_lens,
    row_start_cu,
    token_to_seq,
    ks,
    ke,
    qs_start,
    qs_stop,
    dcp_rank,
    dcp_world,
    interleave,
    *,
    num_reqs,
    COMPRESS_RATIO,
):
    assert dcp_world == 1
    for b in range(num_reqs):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        offset = torch.arange(q1 - q0)
        rows = q0 + offset
        keep = (rows >= qs_start) & (rows < qs_stop)
        start_pos = int(uncompressed_seq_lens[b]) - (q1 - q0)
        out = rows[keep] - qs_start
        ks[out] = int(row_start_cu[b])
        ke[out] = (int(row_start_cu[b]) + (start_pos + 1 + offset[keep]) // COMPRESS_RATIO).to(
            ke.dtype
        )
        token_to_seq[int(cu_seq_lens[b]) : int(cu_seq_lens[b + 1])] = b


def use_cpu_kernels(monkeypatch) -> None:
    """Without Triton, vLLM's indexer-builder kernels run as the transcriptions above."""
    from vllm import triton_utils
    from vllm.v1.attention.backends.mla import compressor_utils, indexer

    if triton_utils.HAS_TRITON:
        return
    monkeypatch.setattr(
        compressor_utils, "_COMPRESSED_SLOT_MAPPING_KERNEL", _compressed_slot_mapping
    )
    monkeypatch.setattr(indexer, "_PREPARE_UNIFORM_DECODE_KERNEL", _uniform_decode)
    monkeypatch.setattr(indexer, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", _prefill_chunk_bounds)


# --- caches --------------------------------------------------------------------------------


def index_cache_layers(cls: type, config: VllmConfig, names: Sequence[str], **kwargs) -> list:
    """vLLM's index-cache layers (``cls`` is its V4 or V3.2 cache class)."""
    with set_current_vllm_config(config):
        return [
            cls(
                head_dim=132,
                dtype=torch.uint8,
                prefix=name,
                cache_config=config.cache_config,
                **kwargs,
            )
            for name in names
        ]


def bind_packed_caches(
    layers: Sequence[Any], config: VllmConfig, num_blocks: int, device: torch.device | str = "cpu"
) -> None:
    """Gives ``layers`` KV caches the way vLLM's allocator views them, block-outermost
    (``BLHNC``): block ``b`` holds every layer's page, so a layer's page stride
    is ``len(layers)`` padded pages, in one allocation on ``device``. Every
    byte starts random."""
    spec = layers[0].get_kv_cache_spec(config)
    page = spec.page_size_bytes
    tensor = KVCacheTensor(
        size=page * len(layers) * num_blocks,
        layers=[layer.prefix for layer in layers],
        layer_stride=page,
        block_stride=page * len(layers),
    )
    raw = torch.randint(-128, 128, (tensor.size,), dtype=torch.int8, device=device)
    views = create_kv_cache_views(raw, spec, num_blocks, KVCacheLayout.BLHNC, tensor)
    for layer, view in zip(layers, views, strict=True):
        layer.bind_kv_cache(view)


def fill_index_cache(cache: torch.Tensor, seed: int) -> None:
    """Writes random FP8 K rows and scales into every page of a ``[blocks, 64, 132]`` cache."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn((cache.shape[0], PAGE, 128), generator=g)
    flatten_index_cache(cache).copy_(reference.pack_index_k_cache(*reference.quantize_index_k(k)))


# --- batches -------------------------------------------------------------------------------


@dataclass
class Request:
    """``seq_len`` tokens in the cache after this step, the last ``query_len`` of them new."""

    seq_len: int
    query_len: int


def block_table(
    requests: Sequence[Request], block_size: int, width: int, num_blocks: int, seed: int
) -> torch.Tensor:
    """Distinct block ids out of ``num_blocks``, shuffled, per request (unused
    slots 0, as vLLM leaves them)."""
    g = torch.Generator().manual_seed(seed)
    table = torch.zeros((len(requests), width), dtype=torch.int32)
    pool = torch.randperm(num_blocks, generator=g).to(torch.int32)
    start = 0
    for r, req in enumerate(requests):
        blocks = -(-req.seq_len // block_size)
        table[r, :blocks] = pool[start : start + blocks]
        start += blocks
    return table


def common_metadata(
    requests: Sequence[Request], table: torch.Tensor, block_size: int
) -> CommonAttentionMetadata:
    """vLLM's per-batch metadata for ``requests`` (reordered: decodes first)."""
    query_lens = torch.tensor([r.query_len for r in requests], dtype=torch.int32)
    seq_lens = torch.tensor([r.seq_len for r in requests], dtype=torch.int32)
    query_start_loc = torch.zeros(len(requests) + 1, dtype=torch.int32)
    query_start_loc[1:] = torch.cumsum(query_lens, 0)
    positions, slots = [], []
    for r, req in enumerate(requests):
        pos = torch.arange(req.seq_len - req.query_len, req.seq_len)
        positions.append(pos)
        slots.append(table[r, pos // block_size].to(torch.int64) * block_size + pos % block_size)
    tokens = int(query_lens.sum())
    return CommonAttentionMetadata(
        query_start_loc=query_start_loc,
        query_start_loc_cpu=query_start_loc.clone(),
        seq_lens=seq_lens,
        num_reqs=len(requests),
        num_actual_tokens=tokens,
        max_query_len=int(query_lens.max()),
        max_seq_len=int(seq_lens.max()),
        block_table_tensor=table,
        slot_mapping=torch.cat(slots) if tokens else torch.zeros(0, dtype=torch.int64),
        positions=torch.cat(positions) if tokens else None,
        seq_lens_cpu_upper_bound=seq_lens.clone(),
    )


def queries(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 index queries ``[tokens, 16, 128]`` and float32 weights ``[tokens, 16]``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((tokens, HEADS, 128), generator=g).to(torch.float8_e4m3fn)
    return q, torch.rand((tokens, HEADS), generator=g)


def visible_rows(requests: Sequence[Request], ratio: int) -> list[tuple[int, int]]:
    """Per token: (its request, the K rows it sees). Causal: position ``p`` sees
    ``(p + 1) // ratio`` rows, vLLM's rule for decode and prefill alike."""
    rows = []
    for r, req in enumerate(requests):
        for p in range(req.seq_len - req.query_len, req.seq_len):
            rows.append((r, (p + 1) // ratio))
    return rows


@contextlib.contextmanager
def workspace_manager() -> Iterator[workspace.WorkspaceManager]:
    """vLLM's global workspace manager on the CPU, for one test."""
    workspace.init_workspace_manager(torch.device("cpu"))
    try:
        yield workspace.current_workspace_manager()
    finally:
        workspace.reset_workspace_manager()


def forward(op: Any, metadata: Any, config: VllmConfig, q: torch.Tensor, w: torch.Tensor, **ctx):
    """``op(hidden_states, q, None, weights)`` inside vLLM's forward context."""
    attn = None if metadata is None else {op.k_cache.prefix: metadata}
    with set_forward_context(attn, config, **ctx):
        return op(torch.empty((q.shape[0], 1)), q, None, w)


# --- vLLM's reference ----------------------------------------------------------------------


def vllm_logits(
    q: torch.Tensor,
    w: torch.Tensor,
    cache: torch.Tensor,
    table: torch.Tensor,
    rows: Sequence[tuple[int, int]],
) -> torch.Tensor:
    """vLLM's PyTorch paged-MQA logits, one query row per token: ``[tokens, width * 64]``."""
    from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

    owners = torch.tensor([r for r, _ in rows], dtype=torch.int64)
    lengths = torch.tensor([n for _, n in rows], dtype=torch.int32)
    return fp8_paged_mqa_logits_torch(
        q[:, None],
        cache.contiguous(),  # its reference views pages densely; the bytes are the same
        w,
        lengths,
        table.index_select(0, owners),
        table.shape[1] * PAGE,
    )


Tensor = torch.Tensor
Rows = Sequence[tuple[int, int]]  # (owning request row, visible positions) per token row

# precision="fast" (dsa_indexer.Caps): each logit within this fraction of its
# magnitude (logit_magnitude) of the fp32 one
FAST_TOLERANCE = 1e-3


def logit_magnitude(q: Tensor, w: Tensor, cache: Tensor, table: Tensor, rows: Rows) -> Tensor:
    """``|scale| * sum_h |w_h| * |q_h . k|`` per token row and position, as
    ``vllm_logits`` lays them out: what the fast precision's tolerance is
    relative to (``|logit|`` itself when no term is negative)."""
    k, scales = reference.unpack_index_k_cache(flatten_index_cache(cache))
    out = torch.zeros(len(rows), table.shape[1] * PAGE, device=q.device)
    for t, (owner, _) in enumerate(rows):
        pids = table[owner].to(device=k.device, dtype=torch.int64).clamp(0, k.shape[0] - 1)
        dots = q[t].float() @ k[pids].float().reshape(-1, k.shape[-1]).T
        terms = dots.abs() * w[t].float().abs()[:, None]
        out[t] = (terms.sum(0) * scales[pids].reshape(-1).abs()).to(out.device)
    return out


def assert_matches_vllm(
    out: torch.Tensor,
    logits: torch.Tensor,
    rows: Sequence[tuple[int, int]],
    topk: int = TOPK,
    magnitude: torch.Tensor | None = None,
) -> None:
    """Each row of ``out`` is a top-k of vLLM's logits: ``min(topk, visible)``
    distinct visible indices whose logits equal ``torch.topk``'s (near-ties may
    swap), and ``-1`` in every other slot. With ``magnitude`` (fast plans) the
    logits b12x selected on may be off by ``FAST_TOLERANCE`` of the row's
    largest magnitude, so a chosen index is one within twice that of entering
    the reference's top-k, and the sorted values agree within it."""
    assert out.shape[0] == len(rows)
    for t, (_, visible) in enumerate(rows):
        want = min(topk, visible)
        chosen = out[t][out[t] >= 0].to(torch.int64)
        assert int((out[t] == -1).sum()) == topk - want, f"row {t}: -1 slots"
        assert chosen.numel() == want and chosen.unique().numel() == want, f"row {t}: count"
        assert want == 0 or int(chosen.max()) < visible, f"row {t}: an index past {visible}"
        got = logits[t, chosen].sort(descending=True).values
        top = logits[t, :visible].topk(want).values
        if magnitude is None or want == 0:
            torch.testing.assert_close(got, top, rtol=1e-5, atol=1e-5, msg=f"row {t}")
            continue
        tol = FAST_TOLERANCE * float(magnitude[t, :visible].max())
        assert float(got[-1]) >= float(top[-1]) - 2 * tol, f"row {t}: a chosen logit too low"
        torch.testing.assert_close(got, top, rtol=0.0, atol=2 * tol, msg=f"row {t}")


def assert_matches_reference(
    out: torch.Tensor,
    q: torch.Tensor,
    w: torch.Tensor,
    cache: torch.Tensor,
    table: torch.Tensor,
    rows: Sequence[tuple[int, int]],
    logits: torch.Tensor | None = None,
) -> None:
    """:func:`assert_matches_vllm` against vLLM's logits of these inputs
    (``logits``, else :func:`vllm_logits`), at the tolerance of the precision
    the plugin plans with."""
    from b12x.integration.vllm import speed_rule

    if logits is None:
        logits = vllm_logits(q, w, cache, table, rows)
    fast = speed_rule.PLAN_PRECISION == "fast"
    magnitude = logit_magnitude(q, w, cache, table, rows) if fast else None
    assert_matches_vllm(out, logits, rows, magnitude=magnitude)


@contextlib.contextmanager
def single_rank_groups(config: VllmConfig) -> Iterator[None]:
    """vLLM's model-parallel groups for one CPU rank (gloo), which its layers
    (``ReplicatedLinear`` ...) look up when a model is built."""
    import socket

    from vllm.distributed import parallel_state

    if parallel_state.model_parallel_is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(config):
        parallel_state.init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            backend="gloo",
        )
        parallel_state.ensure_model_parallel_initialized(1, 1)
    try:
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
