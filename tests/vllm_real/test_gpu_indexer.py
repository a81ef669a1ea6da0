"""b12x's indexer inside the real vLLM 0.33 on its CUDA platform (a GPU host).

vLLM's own code builds everything on ``cuda:0``: its metadata builders (their
persistent buffers, their Triton kernels, DeepGEMM's decode schedule where
DeepGEMM imports), its index-cache layers bound to a packed CUDA allocation,
its forward context and ``WorkspaceManager``; b12x's kernels select. Every
selection is compared with vLLM's ``fp8_paged_mqa_logits_torch`` + top-k on
the GPU, and the decode rows also with DeepGEMM's logits through vLLM's wrapper
where the DeepGEMM peer is present (tie-aware: DeepGEMM accumulates in FP8).
Skipped without a GPU or off vLLM's CUDA platform (``gpu_support.on_cuda``).
"""

from __future__ import annotations

import gpu_support as g
import indexer_support as s
import pytest
import torch
from b12x.integration.vllm import indexer_backend, indexer_hooks
from b12x.integration.vllm.indexer import C4SparseIndexer
from test_indexer_metadata import MIXED, MTP  # the CPU tests' batches, here on CUDA
from vllm.config import CUDAGraphMode, set_current_vllm_config
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

# on_cuda skips off vLLM's CUDA platform; vllm_deep_gemm tells vLLM's builder when
# DeepGEMM does not import (gpu_support says why)
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("on_cuda", "vllm_deep_gemm")]
on_cuda = g.on_cuda
vllm_deep_gemm = g.vllm_deep_gemm

STOCK = DeepseekV32IndexerMetadataBuilder
B12X = indexer_backend.B12xIndexerMetadataBuilder
DEEPGEMM_REL_TOL = 2e-3  # ~3e-4 measured on H200; a wrong row is off by far more
DEEPGEMM_HEADS = 64  # DeepGEMM's logits kernels take 32 or 64 heads

PADDED_MTP = [s.Request(3000, 2), s.Request(1501, 2), s.Request(0, 0)]


def select(model, metadata, q, w):
    with g.workspace_manager():
        return s.forward(model.op, metadata, model.config, q, w)


def check(model, requests, table, q, w, out):
    rows = s.visible_rows(requests, 4)
    assert out.is_cuda
    logits = g.vllm_logits(q, w, model.cache, table, rows)
    s.assert_matches_reference(out[: len(rows)], q, w, model.cache, table, rows, logits)


@pytest.mark.parametrize("cls", [STOCK, B12X], ids=["stock-builder", "b12x-builder"])
def test_mixed_batch_decode_and_multi_request_prefill_chunks(cls):
    model = g.V4Model()
    table = model.table(MIXED, seed=1)
    metadata = model.builder(cls).build(0, model.common(MIXED, table))
    assert metadata.decode.seq_lens.is_cuda
    chunks = [c.num_reqs for c in metadata.prefill.chunks]
    if cls is STOCK:  # vLLM's chunker packs requests together: b12x serves such chunks too
        assert max(chunks) > 1
    else:
        assert chunks == [1, 1, 1]
    q, w = g.queries(metadata.num_decode_tokens + metadata.num_prefill_tokens, seed=2)
    check(model, MIXED, table, q, w, select(model, metadata, q, w))


@pytest.mark.parametrize("cls", [STOCK, B12X], ids=["stock-native", "b12x-flattened"])
def test_multi_token_decode(cls):
    model = g.V4Model(speculative_tokens=1)
    table = model.table(MTP, seed=3)
    metadata = model.builder(cls).build(0, model.common(MTP, table))
    expected = (3, 2) if cls is STOCK else (6, 1)
    assert tuple(metadata.decode.seq_lens.shape) == expected
    q, w = g.queries(6, seed=4)
    check(model, MTP, table, q, w, select(model, metadata, q, w))


def test_padded_native_decode_rows():
    model = g.V4Model(speculative_tokens=1)
    table = model.table(PADDED_MTP, seed=5)
    metadata = model.builder(STOCK).build(0, model.common(PADDED_MTP, table))
    assert metadata.decode.requires_padding and metadata.num_decode_tokens == 4
    q, w = g.queries(4, seed=6)
    out = select(model, metadata, q, w)
    check(model, PADDED_MTP, table, q, w, out)
    assert torch.count_nonzero(out[4:] != -9) == 0  # rows past the batch untouched


def test_decode_agrees_with_deepgemm_through_vllms_wrapper(vllm_deep_gemm):
    if vllm_deep_gemm is None:
        pytest.skip("DeepGEMM does not import here (carry tools/gpu/deepgemm_peer.py's bundle)")
    model = g.V4Model(speculative_tokens=1)
    table = model.table(MTP, seed=7)
    metadata = model.builder(STOCK).build(0, model.common(MTP, table))
    q, w = g.queries(6, seed=8, heads=DEEPGEMM_HEADS)
    out = select(model, metadata, q, w)
    logits = g.deepgemm_decode_logits(metadata, q, w, model.cache, model.op.max_model_len)
    rows = s.visible_rows(MTP, 4)
    g.assert_near_top_k(out[: len(rows)], logits, rows, DEEPGEMM_REL_TOL)
    # and DeepGEMM itself against vLLM's float32 reference, on the visible columns
    ref = g.vllm_logits(q, w, model.cache, table, rows)
    for t, (_, visible) in enumerate(rows):
        scale = ref[t, :visible].abs().max()
        err = (logits[t, :visible].float() - ref[t, :visible]).abs().max()
        assert err <= DEEPGEMM_REL_TOL * scale, f"row {t}: DeepGEMM off by {err / scale:.2e}"


def test_profile_reservation_then_the_locked_workspace_serves_every_batch():
    model = g.V4Model(speculative_tokens=1)
    rows = model.config.scheduler_config.max_num_batched_tokens
    q, w = g.queries(rows, seed=9)
    with g.workspace_manager() as manager:
        s.forward(model.op, None, model.config, q, w,
                  cudagraph_runtime_mode=CUDAGraphMode.NONE,
                  batch_descriptor=BatchDescriptor(num_tokens=rows))  # fmt: skip
        assert torch.count_nonzero(model.buffer != -9) == 0  # reserves, computes nothing
        manager.lock()  # after the profile run nothing may grow it
        for seed, (cls, requests) in enumerate([(STOCK, MIXED), (B12X, MIXED), (STOCK, MTP)]):
            table = model.table(requests, seed=20 + seed)
            metadata = model.builder(cls).build(0, model.common(requests, table))
            tokens = sum(r.query_len for r in requests)
            out = s.forward(model.op, metadata, model.config, q[:tokens], w[:tokens])
            check(model, requests, table, q[:tokens], w[:tokens], out)


# --- DeepSeek V3.2 through the hooks ---------------------------------------------------------

V32_MAX_MODEL_LEN = 8192
V32_WIDTH = V32_MAX_MODEL_LEN // s.V32_BLOCK


@pytest.fixture
def hooks(monkeypatch):
    # b12x serving here whatever the speed rule says of this GPU (the rule's
    # decision on it: test_gpu_plugin.py)
    monkeypatch.setattr(indexer_hooks, "_speed_reason", lambda capability: None)
    indexer_hooks.uninstall()
    yield indexer_hooks
    indexer_hooks.uninstall()


def test_v32_layer_runs_b12x_through_the_call_its_attention_makes(hooks):
    from test_indexer_hooks import v32_call
    from vllm.models.deepseek_v32 import attention as v32

    config = s.make_config(max_model_len=V32_MAX_MODEL_LEN, block_size=s.V32_BLOCK)
    # the real device check, on the real GPU (only the speed rule set aside)
    assert hooks.unsupported_reason(config) is None
    assert hooks.install(config)
    buffer = torch.full((config.scheduler_config.max_num_batched_tokens, s.TOPK), -9,
                        dtype=torch.int32, device=g.DEVICE)  # fmt: skip
    with s.single_rank_groups(config), set_current_vllm_config(config):
        indexer = v32.DeepseekV32Attention.indexer_cls(
            config, config.model_config.hf_config, 256, 128, None, config.cache_config, buffer,
            prefix="model.layers.0.self_attn.indexer",
        )  # fmt: skip
    assert isinstance(indexer, indexer_backend.B12xDeepseekV32Indexer)
    # vLLM's SparseAttnIndexer as b12x registers it out of tree, holding b12x's op
    assert isinstance(indexer.indexer_op, indexer_backend.B12xSparseAttnIndexer)
    op = indexer.indexer_op.b12x
    assert isinstance(op, C4SparseIndexer) and op.compress_ratio == 1
    assert op.topk_indices_buffer.is_cuda
    g.bind_packed_caches([indexer.k_cache], config, num_blocks=256)
    s.fill_index_cache(indexer.k_cache.kv_cache, seed=30)
    requests = [s.Request(3000, 1), s.Request(700, 1), s.Request(1500, 120), s.Request(200, 200)]
    table = s.block_table(requests, s.V32_BLOCK, V32_WIDTH, num_blocks=256, seed=31)
    spec = indexer.k_cache.get_kv_cache_spec(config)
    backend_cls = indexer.k_cache.get_attn_backend()
    with set_current_vllm_config(config):
        builder = backend_cls.get_builder_cls()(
            spec, [indexer.k_cache.prefix], config, g.DEVICE, block_table_width=V32_WIDTH
        )
    metadata = builder.build(0, g.on_device(s.common_metadata(requests, table, s.V32_BLOCK)))
    rows = s.visible_rows(requests, 1)
    q, w = g.queries(len(rows), seed=32)
    hidden = torch.empty((len(rows), 1), device=g.DEVICE)
    with g.workspace_manager(), set_forward_context({indexer.k_cache.prefix: metadata}, config):
        out = v32_call(indexer, q, w, hidden)
    assert out is indexer.topk_indices_buffer
    cache = indexer.k_cache.kv_cache
    logits = g.vllm_logits(q, w, cache, table, rows)
    s.assert_matches_reference(out[: len(rows)], q, w, cache, table, rows, logits)
