"""b12x's indexer on the metadata vLLM 0.33 really builds (DeepSeek V4, C4 layers).

vLLM's own metadata builder (and b12x's subclass of it) turns a batch into
vLLM's dataclasses; ``C4SparseIndexer.forward`` runs in vLLM's forward
context against a ``DeepseekV4IndexerCache`` laid out by vLLM's allocator
code (block-outermost: every block holds both layers' padded pages), on
vLLM's ``WorkspaceManager``. Every selection is checked against vLLM's
``fp8_paged_mqa_logits_torch`` + ``torch.topk``.
"""

from __future__ import annotations

import indexer_support as s
import pytest
import torch
from b12x.integration.vllm import indexer_backend
from b12x.integration.vllm.indexer import C4SparseIndexer
from vllm.config import CUDAGraphMode, set_current_vllm_config
from vllm.forward_context import BatchDescriptor
from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.mla.indexer import DeepseekV32IndexerMetadataBuilder

MAX_MODEL_LEN = 16384
WIDTH = MAX_MODEL_LEN // s.V4_BLOCK  # block-table width: 64 pages of 64 compressed rows
STOCK = DeepseekV32IndexerMetadataBuilder
B12X = indexer_backend.B12xIndexerMetadataBuilder


@pytest.fixture(autouse=True)
def _kernels(monkeypatch):
    s.use_cpu_kernels(monkeypatch)


class Model:
    """Two V4 C4 layers' index caches in one packed allocation, and b12x's op on the first."""

    def __init__(self, speculative_tokens=0, num_blocks=256):
        self.config = s.make_config(
            max_model_len=MAX_MODEL_LEN, speculative_tokens=speculative_tokens
        )
        self.layers = s.index_cache_layers(
            DeepseekV4IndexerCache,
            self.config,
            ["model.layers.0.attn.indexer.k_cache", "model.layers.1.attn.indexer.k_cache"],
            compress_ratio=4,
        )
        self.num_blocks = num_blocks
        s.bind_packed_caches(self.layers, self.config, num_blocks)
        for i, layer in enumerate(self.layers):
            s.fill_index_cache(layer.kv_cache, seed=10 + i)
        self.buffer = torch.full(
            (self.config.scheduler_config.max_num_batched_tokens, s.TOPK), -9, dtype=torch.int32
        )
        self.op = C4SparseIndexer(
            self.layers[0],
            128,
            "ue8m0",
            s.TOPK,
            128,
            MAX_MODEL_LEN // 4,
            0,
            self.buffer,
            skip_k_cache_insert=True,
            compress_ratio=4,
        )

    @property
    def cache(self):
        return self.layers[0].kv_cache

    def builder(self, cls):
        spec = self.layers[0].get_kv_cache_spec(self.config)
        with set_current_vllm_config(self.config):
            return cls(
                spec,
                [self.layers[0].prefix],
                self.config,
                torch.device("cpu"),
                block_table_width=WIDTH,
            )

    def build(self, cls, requests, seed=0):
        table = s.block_table(requests, s.V4_BLOCK, WIDTH, self.num_blocks, seed=seed)
        common = s.common_metadata(requests, table, s.V4_BLOCK)
        return table, self.builder(cls).build(0, common)

    def select(self, metadata, q, w):
        with s.workspace_manager():
            return s.forward(self.op, metadata, self.config, q, w)


def check(model, requests, table, q, w, out):
    rows = s.visible_rows(requests, 4)
    s.assert_matches_reference(out[: len(rows)], q, w, model.cache, table, rows)


MIXED = [
    s.Request(3001, 1),  # decode
    s.Request(911, 1),  # decode
    s.Request(2400, 200),  # prefill chunk of a longer prompt
    s.Request(1200, 1200),  # whole prompt
    s.Request(9, 9),  # 2 compressed rows: fewer than top-k
]


def test_stock_builder_packs_several_requests_in_one_chunk_and_b12x_serves_it():
    model = Model()
    table, metadata = model.build(STOCK, MIXED)
    (chunk,) = metadata.prefill.chunks  # upstream's chunker: one chunk, three requests
    assert chunk.num_reqs == 3
    q, w = s.queries(metadata.num_decode_tokens + metadata.num_prefill_tokens, seed=1)
    out = model.select(metadata, q, w)  # raised "prefill chunk expected 1 request" before
    check(model, MIXED, table, q, w, out)


def test_b12x_builder_gives_one_request_per_chunk_and_flattened_decode():
    model = Model()
    table, metadata = model.build(B12X, MIXED)
    assert [c.num_reqs for c in metadata.prefill.chunks] == [1, 1, 1]
    assert metadata.decode.seq_lens.shape == (2, 1) and not metadata.decode.requires_padding
    q, w = s.queries(metadata.num_decode_tokens + metadata.num_prefill_tokens, seed=2)
    check(model, MIXED, table, q, w, model.select(metadata, q, w))


def test_b12x_builder_is_graph_capturable_for_any_batch():
    model = Model(speculative_tokens=1)
    spec = model.layers[0].get_kv_cache_spec(model.config)
    assert B12X.get_cudagraph_support(model.config, spec) is AttentionCGSupport.ALWAYS
    builder = model.builder(B12X)
    assert builder.use_flattening and not builder.supports_varlen


MTP = [s.Request(3000, 2), s.Request(1501, 2), s.Request(700, 2)]


@pytest.mark.parametrize("cls", [STOCK, B12X], ids=["stock", "b12x"])
def test_multi_token_decode(cls):
    model = Model(speculative_tokens=1)
    table, metadata = model.build(cls, MTP)
    decode = metadata.decode
    if cls is STOCK:  # native: one [B, next_n] row of lengths per request
        assert decode.seq_lens.shape == (3, 2) and decode.block_table.shape[0] == 3
    else:
        assert decode.seq_lens.shape == (6, 1)
    q, w = s.queries(6, seed=3)
    check(model, MTP, table, q, w, model.select(metadata, q, w))


def test_padded_native_decode_rows():
    # A graph-padded batch: a padding request with no tokens, so decode_lens
    # [2, 2, 0] differ and vLLM sets requires_padding (b12x raised on it).
    model = Model(speculative_tokens=1)
    requests = [s.Request(3000, 2), s.Request(1501, 2), s.Request(0, 0)]
    table, metadata = model.build(STOCK, requests)
    assert metadata.decode.requires_padding
    assert metadata.decode.seq_lens.shape == (3, 2) and metadata.num_decode_tokens == 4
    q, w = s.queries(4, seed=4)
    out = model.select(metadata, q, w)
    check(model, requests, table, q, w, out)
    assert torch.count_nonzero(out[4:] != -9) == 0  # rows past the batch untouched


def test_prefill_rows_no_chunk_covers_get_minus_one():
    # A 3-token prompt has no compressed row: vLLM builds no chunk for it.
    model = Model()
    requests = [s.Request(3, 3), s.Request(500, 100)]
    table, metadata = model.build(B12X, requests)
    assert [c.token_start for c in metadata.prefill.chunks] == [3]
    q, w = s.queries(103, seed=5)
    out = model.select(metadata, q, w)
    assert torch.all(out[:3] == -1)
    check(model, requests, table, q, w, out)


def test_profile_run_reserves_then_locked_workspace_serves_every_batch():
    model = Model(speculative_tokens=1)
    rows = model.config.scheduler_config.max_num_batched_tokens
    q, w = s.queries(rows, seed=6)
    with s.workspace_manager() as manager:
        # vLLM's profile run: no metadata, eager, a batch descriptor.
        s.forward(
            model.op,
            None,
            model.config,
            q,
            w,
            cudagraph_runtime_mode=CUDAGraphMode.NONE,
            batch_descriptor=BatchDescriptor(num_tokens=rows),
        )
        assert torch.count_nonzero(model.buffer != -9) == 0  # reserves, computes nothing
        manager.lock()  # after the profile run nothing may grow it
        for cls, requests in [(STOCK, MIXED), (B12X, MIXED), (STOCK, MTP), (B12X, MTP)]:
            table, metadata = model.build(cls, requests)
            tokens = sum(r.query_len for r in requests)
            out = s.forward(model.op, metadata, model.config, q[:tokens], w[:tokens])
            check(model, requests, table, q[:tokens], w[:tokens], out)
