"""The voipmonitor vLLM fork's own adapter file, run unmodified on this b12x.

``vllm/models/deepseek_v4/nvidia/b12x_indexer.py`` of the fork imports two
names stock vLLM 0.33 does not have: ``vllm.utils.b12x.get_b12x_dsa_indexer``
and ``vllm.v1.attention.backends.mla.indexer.split_indexer_prefill_chunks``.
The test provides exactly those two (the first returns this b12x's
``b12x.attention.dsa_indexer``, the second the fork's one-request chunking)
and nothing of b12x, loads the file as it is, and runs its indexer on the
metadata vLLM's builder makes, against vLLM's real V4 index cache and
workspace manager; every selection is compared with vLLM's reference.

The file is another project's code, so it is not part of this repository:
set ``B12X_FORK_INDEXER_FILE`` to a copy of it (the fork's commit
f21c11418ebf is the one checked), or install the fork's vLLM (the file then
sits inside the ``vllm`` package). Without either the tests skip, saying so.
This CPU has no GPU the kernels run on: ``is_supported()``, the one check
the file makes of the device, stands in for one.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import indexer_support as s
import pytest
import torch
import vllm
from b12x.attention import dsa_indexer
from b12x.integration.vllm import indexer_backend
from vllm.config import CUDAGraphMode
from vllm.forward_context import BatchDescriptor
from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache

FORK_NAME = "vllm/models/deepseek_v4/nvidia/b12x_indexer.py"
MAX_MODEL_LEN = 16384
WIDTH = MAX_MODEL_LEN // s.V4_BLOCK


def fork_file() -> Path | None:
    given = os.environ.get("B12X_FORK_INDEXER_FILE")
    if given:
        return Path(given)
    inside = Path(vllm.__file__).parent.parent / FORK_NAME
    return inside if inside.exists() else None


pytestmark = pytest.mark.skipif(
    fork_file() is None,
    reason=f"the fork's {FORK_NAME} is not vendored (another project's code): set "
    "B12X_FORK_INDEXER_FILE to a copy of it to run it",
)


def one_request_chunks(compressed_seq_lens, query_lens, workspace_size, max_logits_bytes,
                       request_offset=0):  # fmt: skip
    """The fork's prefill chunker as its b12x builder uses it: one chunk for each
    request's rows (this b12x's prefill route takes a whole request at once)."""
    del compressed_seq_lens, workspace_size, max_logits_bytes
    return [
        (slice(request_offset + i, request_offset + i + 1), slice(0, int(n)))
        for i, n in enumerate(query_lens.tolist())
    ]


@pytest.fixture
def fork(monkeypatch):
    """The fork's module, loaded from its file with the two fork-only names provided."""
    import vllm.utils.b12x as vllm_b12x
    import vllm.v1.attention.backends.mla.indexer as vllm_indexer

    s.use_cpu_kernels(monkeypatch)
    monkeypatch.setattr(vllm_b12x, "get_b12x_dsa_indexer", lambda: dsa_indexer, raising=False)
    monkeypatch.setattr(
        vllm_indexer, "split_indexer_prefill_chunks", one_request_chunks, raising=False
    )
    monkeypatch.setattr(dsa_indexer, "is_supported", lambda device=None: True)  # the GPU stand-in
    path = fork_file()
    assert path is not None and path.exists(), path
    spec = importlib.util.spec_from_file_location("fork_b12x_indexer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def model(fork):
    config = s.make_config(max_model_len=MAX_MODEL_LEN)
    (layer,) = s.index_cache_layers(
        DeepseekV4IndexerCache, config, ["model.layers.0.attn.indexer.k_cache"], compress_ratio=4
    )
    s.bind_packed_caches([layer], config, num_blocks=256)
    s.fill_index_cache(layer.kv_cache, seed=30)
    buffer = torch.full((config.scheduler_config.max_num_batched_tokens, s.TOPK), -9,
                        dtype=torch.int32)  # fmt: skip
    op = fork.B12xC4SparseIndexer(
        layer, 128, "ue8m0", s.TOPK, 128, MAX_MODEL_LEN // 4, 0, buffer,
        skip_k_cache_insert=True, compress_ratio=4,
    )  # fmt: skip
    return config, layer, op


def test_the_forks_file_loads_with_only_its_two_fork_names_and_checks_this_b12x(fork):
    assert fork._require_b12x_indexer() is dsa_indexer
    assert fork.b12x_indexer_is_supported() is False  # vLLM's platform here is the CPU


def test_the_forks_indexer_matches_vllm_on_vllms_metadata(fork):
    config, layer, op = model(fork)
    requests = [s.Request(3001, 1), s.Request(911, 1), s.Request(2400, 200), s.Request(9, 9)]
    table = s.block_table(requests, s.V4_BLOCK, WIDTH, 256, seed=31)
    spec = layer.get_kv_cache_spec(config)
    with s.set_current_vllm_config(config):
        builder = indexer_backend.B12xIndexerMetadataBuilder(
            spec, [layer.prefix], config, torch.device("cpu"), block_table_width=WIDTH
        )
    metadata = builder.build(0, s.common_metadata(requests, table, s.V4_BLOCK))
    assert [c.num_reqs for c in metadata.prefill.chunks] == [1, 1]  # what the file requires
    tokens = metadata.num_decode_tokens + metadata.num_prefill_tokens
    profile = config.scheduler_config.max_num_batched_tokens
    q, w = s.queries(profile, seed=32)
    with s.workspace_manager() as manager:
        # vLLM's profile run: no metadata, eager, a batch descriptor (the file reserves)
        s.forward(op, None, config, q, w, cudagraph_runtime_mode=CUDAGraphMode.NONE,
                  batch_descriptor=BatchDescriptor(num_tokens=profile))  # fmt: skip
        manager.lock()  # after the profile run nothing may grow it
        q, w = q[:tokens], w[:tokens]
        out = s.forward(op, metadata, config, q, w)
    rows = s.visible_rows(requests, 4)
    s.assert_matches_reference(out[: len(rows)], q, w, layer.kv_cache, table, rows)
