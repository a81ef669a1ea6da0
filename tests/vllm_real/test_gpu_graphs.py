"""b12x's indexer captured and replayed under vLLM 0.33's own CUDA-graph machinery (GPU host).

vLLM's ``CudagraphDispatcher`` (FULL decode graphs, vLLM's capture sizes) picks
the graph and its ``BatchDescriptor``; the capture runs inside vLLM's
``graph_capture`` (its TP / PP / DP ``GroupCoordinator.graph_capture``, its
capture stream) with the forward context vLLM sets for a FULL graph. The
capture batch is vLLM's dummy batch; then, like vLLM's runner, the test
rebuilds the metadata with the same builder (which rewrites its persistent
buffers in place), pads the batch the way the runner pads it, copies the new
queries into the graph's inputs and replays: every real row must match vLLM's
reference for the new batch.
"""

from __future__ import annotations

import gpu_support as g
import indexer_support as s
import pytest
import torch
from b12x.integration.vllm import indexer_backend
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("on_cuda", "vllm_deep_gemm")]
on_cuda = g.on_cuda
vllm_deep_gemm = g.vllm_deep_gemm

B12X = indexer_backend.B12xIndexerMetadataBuilder


def decode_buffers(metadata) -> list[tuple[int, tuple[int, ...]]]:
    """Addresses and shapes of the decode tensors a captured graph reads."""
    decode = metadata.decode
    return [(t.data_ptr(), tuple(t.shape)) for t in (decode.seq_lens, decode.block_table)]


def capture(model, metadata, desc, hidden, q, w) -> torch.cuda.CUDAGraph:
    """One FULL graph of the op, captured as vLLM's runner captures it."""
    from vllm.distributed.parallel_state import graph_capture

    graph = torch.cuda.CUDAGraph()
    attn = {model.prefix: metadata}
    with (
        graph_capture(g.DEVICE) as context,
        set_forward_context(
            attn, model.config, cudagraph_runtime_mode=CUDAGraphMode.FULL, batch_descriptor=desc
        ),  # fmt: skip
    ):
        model.op(hidden, q, None, w)  # the warm-up run vLLM makes before capturing
        with torch.cuda.graph(graph, stream=context.stream):
            model.op(hidden, q, None, w)
    torch.cuda.synchronize()
    return graph


def live_batch(real: int, depth: int, seed: int) -> list[s.Request]:
    g_ = torch.Generator().manual_seed(seed)
    lengths = torch.randint(600, 12000, (real,), generator=g_).tolist()
    return [s.Request(int(n), depth) for n in lengths]


@pytest.mark.parametrize("speculative_tokens", [0, 1], ids=["decode", "mtp"])
def test_a_full_decode_graph_gives_fresh_results_after_each_metadata_rewrite(speculative_tokens):
    depth = 1 + speculative_tokens
    model = g.V4Model(speculative_tokens=speculative_tokens)
    dispatcher = g.full_decode_dispatcher(model.config, depth)
    ((mode, descs),) = dispatcher.get_capture_descs()
    desc = max(descs, key=lambda d: d.num_tokens)
    assert mode is CUDAGraphMode.FULL and desc.uniform and desc.num_reqs * depth == desc.num_tokens
    builder = model.builder(B12X)  # one builder for the capture and every replay, as vLLM's
    hidden = torch.empty((desc.num_tokens, 1), device=g.DEVICE)
    q_in = torch.zeros((desc.num_tokens, s.HEADS, 128), dtype=torch.float8_e4m3fn, device=g.DEVICE)
    w_in = torch.zeros((desc.num_tokens, s.HEADS), device=g.DEVICE)
    rows = model.config.scheduler_config.max_num_batched_tokens
    with s.single_rank_groups(model.config), g.workspace_manager() as manager:
        q, w = g.queries(rows, seed=0)
        s.forward(model.op, None, model.config, q, w,
                  cudagraph_runtime_mode=CUDAGraphMode.NONE,
                  batch_descriptor=BatchDescriptor(num_tokens=rows))  # fmt: skip
        manager.lock()  # vLLM locks the workspace after its profile run
        # vLLM's capture batch: every request's context is just its query, null blocks
        dummy = [s.Request(depth, depth)] * desc.num_reqs
        null_table = torch.zeros((desc.num_reqs, model.width), dtype=torch.int32)
        captured_with = builder.build(0, model.common(dummy, null_table))
        graph = capture(model, captured_with, desc, hidden, q_in, w_in)
        captured = decode_buffers(captured_with)
        # full, then padded as vLLM pads (a request short), then full again: each
        # dispatches to the captured graph
        for seed, real in enumerate([desc.num_reqs, desc.num_reqs - 1, desc.num_reqs], start=1):
            requests = live_batch(real, depth, seed)
            tokens = real * depth
            assert dispatcher.dispatch(tokens, uniform_decode=True) == (CUDAGraphMode.FULL, desc)
            table = model.table(requests, seed=seed)
            common = g.padded_for_graph(model.common(requests, table), desc.num_reqs,
                                        desc.num_tokens)  # fmt: skip
            metadata = builder.build(0, common)
            assert decode_buffers(metadata) == captured  # rewritten in place, not moved
            q, w = g.queries(tokens, seed=100 + seed)
            q_in[:tokens].copy_(q)
            w_in[:tokens].copy_(w)
            model.buffer.fill_(-9)
            graph.replay()
            torch.cuda.synchronize()
            visible = s.visible_rows(requests, 4)
            logits = g.vllm_logits(q, w, model.cache, table, visible)
            s.assert_matches_reference(model.buffer[:tokens], q, w, model.cache, table, visible,
                                       logits)  # fmt: skip
