"""The GPU tests' batch padding and graph dispatch, checked on vLLM's CPU platform.

``test_gpu_graphs`` replays a graph on batches padded the way vLLM's runner pads
them for a FULL CUDA graph (:func:`gpu_support.padded_for_graph`) and dispatched
by vLLM's ``CudagraphDispatcher`` (:func:`gpu_support.full_decode_dispatcher`).
Both are plain vLLM metadata and config, so they are checked here on the CPU:
the padded batch is what vLLM's split sees as all decode, b12x's builder and op
serve it with the real rows matching vLLM's reference, and the dispatcher maps
the live token counts to the captured graph. On vLLM's CUDA platform this file
skips (it builds CPU tensors); the GPU file runs instead.
"""

from __future__ import annotations

import gpu_support as g
import indexer_support as s
import pytest
import torch
from b12x.integration.vllm import indexer_backend
from test_indexer_metadata import Model, check
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.v1.attention.backends.utils import split_decodes_and_prefills


@pytest.fixture(autouse=True)
def _cpu_platform(monkeypatch):
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        pytest.skip("checks on vLLM's CPU platform (CPU tensors); test_gpu_graphs runs here")
    s.use_cpu_kernels(monkeypatch)


@pytest.mark.parametrize("depth", [1, 2])
def test_the_dispatcher_sends_full_and_padded_batches_to_the_largest_graph(depth):
    dispatcher = g.full_decode_dispatcher(s.make_config(speculative_tokens=depth - 1), depth)
    ((mode, descs),) = dispatcher.get_capture_descs()
    assert mode is CUDAGraphMode.FULL
    largest = max(descs, key=lambda d: d.num_tokens)
    assert largest == BatchDescriptor(num_tokens=8, num_reqs=8 // depth, uniform=True)
    for reqs in (largest.num_reqs, largest.num_reqs - 1):
        assert dispatcher.dispatch(reqs * depth, uniform_decode=True) == (mode, largest)


def test_a_batch_padded_as_vllms_runner_pads_it_is_all_decode_and_served_row_for_row():
    model = Model(speculative_tokens=1)
    requests = [s.Request(3000, 2), s.Request(1501, 2), s.Request(700, 2)]
    table = s.block_table(requests, s.V4_BLOCK, 64, model.num_blocks, seed=1)
    padded = g.padded_for_graph(s.common_metadata(requests, table, s.V4_BLOCK), 4, 8)
    assert padded.query_start_loc.tolist() == [0, 2, 4, 6, 6]
    assert padded.seq_lens.tolist() == [3000, 1501, 700, 0]
    assert padded.block_table_tensor[3].eq(g.NULL_BLOCK_ID).all()
    assert padded.slot_mapping[6:].eq(g.PAD_SLOT_ID).all() and padded.positions.shape == (8,)
    assert split_decodes_and_prefills(padded, decode_threshold=2) == (4, 0, 8, 0)
    metadata = model.builder(indexer_backend.B12xIndexerMetadataBuilder).build(0, padded)
    assert metadata.num_decode_tokens == 8
    q, w = s.queries(8, seed=2)
    out = model.select(metadata, q, w)
    check(model, requests, table, q[:6], w[:6], out[:6])
    assert torch.all(out[8:] == -9)  # nothing past the graph's rows
