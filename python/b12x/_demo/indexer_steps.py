"""The C4 indexer through the vLLM adapter: CPU (reference) and one GPU (kernels
under a CUDA graph). Each step checks every selected row against the reference."""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import torch

from b12x._demo import StepResult
from b12x._demo.model import (
    GrowingWorkspace,
    IndexProjections,
    Shape,
    build_batch,
    check_selection,
    forward_context,
)
from b12x.bench.common import capture_graph, gpu_time_us

if TYPE_CHECKING:
    from b12x.integration.vllm import C4SparseIndexer

PREFIX = "model.layers.2.self_attn.indexer"
SENTINEL = -5  # never written by a selection (indices are >= -1)


def indexer_module() -> tuple[Any, str | None]:
    """``(dsa_indexer, None)``, or ``(None, why)`` when this build lacks it."""
    try:
        from b12x.attention import dsa_indexer
    except ImportError as e:
        return None, f"b12x.attention.dsa_indexer is not in this build ({e})"
    return dsa_indexer, None


def _adapter(
    batch: Any, topk: int, rows: int, max_model_len: int, device: torch.device, **kw: Any
) -> C4SparseIndexer:
    from b12x.integration.vllm import C4SparseIndexer

    return C4SparseIndexer(
        SimpleNamespace(prefix=PREFIX, kv_cache=batch.cache),
        quant_block_size=128,
        scale_fmt="ue8m0",
        topk_tokens=topk,
        head_dim=128,
        max_model_len=max_model_len,
        max_total_seq_len=max_model_len,
        topk_indices_buffer=torch.full((rows, topk), SENTINEL, dtype=torch.int32, device=device),
        skip_k_cache_insert=True,
        compress_ratio=4,
        **kw,
    )


def cpu_indexer_step() -> StepResult:
    """Decode rows and two prefill requests through ``C4SparseIndexer.forward``."""
    name, where = "indexer: decode + prefill (adapter)", "cpu"
    module, why = indexer_module()
    if module is None:
        return StepResult(name, where, f"skipped: {why}", status="skip")
    shape = Shape(hidden=1024)  # DeepSeek V4 is 7168; smaller keeps the CPU run short
    layer = IndexProjections(shape)
    cpu = torch.device("cpu")
    batch = build_batch(
        layer,
        module.reference,
        decode_positions=[1999, 5999, 9000, 23999],
        prefill_chunks=[(3000, 8), (1200, 8)],
        device=cpu,
    )
    tokens = batch.q_fp8.shape[0]
    workspace = GrowingWorkspace(cpu)
    context = forward_context(batch, PREFIX)
    max_model_len = 131072 // 4  # a 128k-token context, in compressed rows
    indexer = _adapter(
        batch,
        shape.topk,
        tokens,
        max_model_len,
        cpu,
        workspace_manager=lambda: workspace,
        forward_context=lambda: context,
    )
    indexer.reserve_profile_workspace(batch.q_fp8)
    reserved = workspace.buffer.numel()
    start = time.perf_counter()
    out = indexer(None, batch.q_fp8, None, batch.weights)
    elapsed = time.perf_counter() - start
    decode_rows = batch.metadata.num_decode_tokens
    chunks = len(batch.metadata.prefill.chunks)
    summary = (
        f"{decode_rows} decode + {tokens - decode_rows} prefill rows ({chunks} one-request "
        f"chunks), {shape.index_heads} heads, top-{shape.topk}, up to {batch.max_k_rows} K rows; "
        f"profile reserved {reserved / 2**20:.1f} MiB"
    )
    try:
        if bool((out == SENTINEL).any()):
            raise AssertionError("some output slots were never written")
        check_selection(module.reference, batch, out, shape.topk)
    except AssertionError as e:
        return StepResult(
            name, where, f"{summary}; MISMATCH: {e}", f"{elapsed * 1e3:.1f} ms", "FAIL"
        )
    return StepResult(name, where, f"{summary}; matches reference", f"{elapsed * 1e3:.1f} ms", "ok")


def _replay_us(graph: torch.cuda.CUDAGraph, repeats: int = 50) -> float:
    return statistics.median(gpu_time_us(graph.replay, repeats, sync_each=True))


def gpu_indexer_step(ordinal: int = 0) -> StepResult:
    """Decode rows on one GPU: eager, captured in a CUDA graph, replayed after
    rewriting the lengths in place; each result checked against the reference."""
    name, where = "indexer: decode, CUDA graph", f"cuda:{ordinal}"
    if not torch.cuda.is_available():
        return StepResult(name, "gpu", "skipped: no CUDA GPU", status="skip")
    module, why = indexer_module()
    if module is None:
        return StepResult(name, where, f"skipped: {why}", status="skip")
    if not module.is_supported(f"cuda:{ordinal}"):
        return StepResult(
            name,
            where,
            "skipped: indexer kernels not available here (dsa_indexer.is_supported() is False)",
            status="skip",
        )
    device = torch.device("cuda", ordinal)
    torch.cuda.set_device(device)
    shape = Shape()
    layer = IndexProjections(shape).to(device)
    positions = [4095, 16383, 40000, 65535, 90000, 110000, 120000, 131071]
    batch = build_batch(layer, module.reference, positions, [], device)
    rows = batch.rows[0]
    workspace = GrowingWorkspace(device)
    indexer = _adapter(
        batch, shape.topk, len(positions), 131072 // 4, device, workspace_manager=lambda: workspace
    )
    out = indexer.topk_indices_buffer

    def step() -> None:
        indexer.run_paged_topk(
            q=batch.q_fp8,
            weights=batch.weights,
            kv_cache=batch.cache,
            seq_lens=rows.lengths,
            block_table=rows.page_table,
            output=out,
            shared_page_table=False,
        )

    try:
        step()  # eager: plans (loads the kernels) and grows the workspace
        torch.cuda.synchronize()
        check_selection(module.reference, batch, out, shape.topk)
        graph = capture_graph(step, device=device, warmup=False)
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check_selection(module.reference, batch, out, shape.topk)
        # Live metadata: new lengths in the same buffers, then replay the same graph.
        rows.lengths.copy_((rows.lengths // 3 + 100).clamp(max=rows.lengths))
        out.fill_(SENTINEL)
        graph.replay()
        torch.cuda.synchronize()
        check_selection(module.reference, batch, out, shape.topk)
        replay_us = _replay_us(graph)
    except AssertionError as e:
        return StepResult(name, where, f"MISMATCH: {e}", status="FAIL")
    summary = (
        f"{len(positions)} rows x up to {batch.max_k_rows} K rows, {shape.index_heads} heads, "
        f"top-{shape.topk}: eager, graph replay and replay after rewriting lengths match reference"
    )
    return StepResult(name, where, summary, f"{replay_us:.1f} us/replay", "ok")
