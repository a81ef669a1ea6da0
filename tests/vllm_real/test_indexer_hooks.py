"""``indexer_hooks.install()``: stock vLLM 0.33 builds b12x's indexer for DeepSeek V3.2 and V4.

The hooks sit in vLLM's own seams (``DeepseekV4Attention._get_indexer_cls``,
``DeepseekV32Attention.indexer_cls``, V3.2's ``sparse_attn_indexer``) and in
vLLM's extension point for its ``SparseAttnIndexer`` custom op (registered
out of tree). Layers are built by vLLM's real classes; the V3.2
layer then runs through the exact call its attention makes. This CPU has no
GPU the kernels run on, so the tests that install stand in for that one
check (``_device_reason``); the refusal itself is tested unpatched.
"""

from __future__ import annotations

import logging

import indexer_support as s
import pytest
import torch
from b12x.integration.vllm import _once, indexer_hooks
from b12x.integration.vllm import indexer_backend as backend
from b12x.integration.vllm.indexer import C4SparseIndexer
from vllm.config import set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.custom_op import op_registry_oot
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.models.deepseek_v4.attention import DeepseekV4Attention, DeepseekV4Indexer
from vllm.models.deepseek_v32 import attention as v32

V32_MAX_MODEL_LEN = 8192
V32_WIDTH = V32_MAX_MODEL_LEN // s.V32_BLOCK


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    s.use_cpu_kernels(monkeypatch)
    indexer_hooks.uninstall()
    monkeypatch.setattr(_once, "LOGGED", set())
    yield
    indexer_hooks.uninstall()


@pytest.fixture
def gpu_ok(monkeypatch):
    """Stands in for a GPU the indexer kernels run on (the only check patched)."""
    monkeypatch.setattr(indexer_hooks, "_device_reason", lambda: None)


def vllm_seams():
    return (
        DeepseekV4Attention.__dict__["_get_indexer_cls"],
        v32.DeepseekV32Attention.__dict__["indexer_cls"],
        op_registry_oot.get("SparseAttnIndexer"),
        v32.sparse_attn_indexer,
    )


def test_without_a_supported_gpu_install_declines_and_logs_once(caplog):
    before = vllm_seams()
    with caplog.at_level(logging.INFO, logger="b12x.integration.vllm"):
        assert indexer_hooks.install() is False
        assert indexer_hooks.install(s.make_config()) is False
    reasons = [r.getMessage() for r in caplog.records if "b12x indexer not used" in r.getMessage()]
    assert len(reasons) == 1 and "platform is 'cpu'" in reasons[0]
    assert not indexer_hooks.installed()
    assert vllm_seams() == before


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda c: setattr(c.parallel_config, "decode_context_parallel_size", 2), "decode context"),
        (
            lambda c: setattr(c.parallel_config, "prefill_context_parallel_size", 2),
            "prefill context",
        ),
        (lambda c: setattr(c.attention_config, "indexer_kv_dtype", "mxfp4"), "mxfp4"),
        (
            lambda c: setattr(c.speculative_config, "enable_adaptive_verification", True),
            "adaptive verification",
        ),
    ],
)
def test_an_unsupported_config_is_declined_with_its_reason(gpu_ok, change, reason, caplog):
    config = s.make_config(speculative_tokens=1)
    change(config)
    assert reason in indexer_hooks.unsupported_reason(config)
    with caplog.at_level(logging.INFO, logger="b12x.integration.vllm"):
        assert indexer_hooks.install(config) is False
    assert not indexer_hooks.installed()
    assert indexer_hooks.install() is True  # the GPU alone is fine
    # a layer built with the unsupported config keeps vLLM's indexer
    assert DeepseekV4Attention._get_indexer_cls(None, config) is DeepseekV4Indexer
    assert sum(reason in r.getMessage() for r in caplog.records) == 1


def test_install_is_idempotent_and_uninstall_restores_vllm(gpu_ok):
    before = vllm_seams()
    config = s.make_config()
    assert indexer_hooks.install(config) is True
    hooked = vllm_seams()
    assert indexer_hooks.install(config) is True and indexer_hooks.install() is True
    assert vllm_seams() == hooked and all(a is not b for a, b in zip(hooked, before, strict=True))
    indexer_hooks.uninstall()
    assert vllm_seams() == before and not indexer_hooks.installed()


def test_v4_layers_get_b12x_indexer_cache_backend_and_builder(gpu_ok):
    config = s.make_config()
    assert indexer_hooks.install(config)
    cls = DeepseekV4Attention._get_indexer_cls(None, config)
    assert cls is backend.B12xDeepseekV4Indexer and issubclass(cls, DeepseekV4Indexer)
    with s.single_rank_groups(config), set_current_vllm_config(config):
        indexer = cls(
            config,
            config.model_config.hf_config,
            256,
            128,
            None,
            config.cache_config,
            torch.full(
                (config.scheduler_config.max_num_batched_tokens, s.TOPK), -9, dtype=torch.int32
            ),
            compress_ratio=4,
            prefix="model.layers.0.attn.indexer",
        )
    op = indexer.indexer_op
    assert isinstance(op, C4SparseIndexer) and op.compress_ratio == 4
    assert op.max_model_len == config.model_config.max_model_len // 4
    backend_cls = indexer.k_cache.get_attn_backend()
    assert backend_cls.get_name() == "DEEPSEEK_V4_B12X_INDEXER"
    assert backend_cls.get_builder_cls() is backend.B12xIndexerMetadataBuilder
    assert backend_cls.get_supported_kernel_block_sizes() == [s.V4_BLOCK]


def v32_indexer(config, prefix):
    with s.single_rank_groups(config), set_current_vllm_config(config):
        return v32.DeepseekV32Attention.indexer_cls(
            config,
            config.model_config.hf_config,
            256,
            128,
            None,
            config.cache_config,
            torch.full(
                (config.scheduler_config.max_num_batched_tokens, s.TOPK), -9, dtype=torch.int32
            ),
            prefix=prefix,
        )


def v32_call(indexer, q, w, hidden):
    """``DeepseekV32Attention._sparse_indexer_and_attn``'s call, argument for argument."""
    return v32.sparse_attn_indexer(
        hidden,
        indexer.k_cache.prefix,
        indexer.k_cache.kv_cache,
        q,
        None,
        None,
        w,
        indexer.quant_block_size,
        indexer.scale_fmt,
        indexer.topk_tokens,
        indexer.head_dim,
        indexer.max_model_len,
        indexer.max_total_seq_len,
        indexer.topk_indices_buffer,
        skip_k_cache_insert=True,
        use_pcp=False,
        pcp_shard_decode_requests=False,
        dense_mha_metadata_layer_name="",
        dcp_rank=0,
        dcp_world_size=1,
        cp_kv_cache_interleave_size=1,
        skip_topk_buffer_clear=True,
        topk_backend=indexer.indexer_op.topk_backend,
    )


def test_v32_layers_run_b12x_through_the_call_their_attention_makes(gpu_ok):
    # Before: V3.2 hard-coded SparseAttnIndexer, and b12x's op refused its
    # compress_ratio=1 with a ConfigError.
    config = s.make_config(max_model_len=V32_MAX_MODEL_LEN, block_size=s.V32_BLOCK)
    assert indexer_hooks.install(config)
    indexer = v32_indexer(config, "model.layers.0.self_attn.indexer")
    assert isinstance(indexer, backend.B12xDeepseekV32Indexer)
    # vLLM's own SparseAttnIndexer(...) call gave b12x's op: registered out of tree
    op = indexer.indexer_op
    assert type(op) is backend.B12xSparseAttnIndexer and isinstance(op, SparseAttnIndexer)
    assert isinstance(op.b12x, C4SparseIndexer) and op.b12x.compress_ratio == 1
    assert backend.v32_ops() == {indexer.k_cache.prefix: op.b12x}
    backend_cls = indexer.k_cache.get_attn_backend()
    assert backend_cls.get_name() == "DEEPSEEK_V32_B12X_INDEXER"
    assert not indexer.k_cache.uses_shuffled_layout

    s.bind_packed_caches([indexer.k_cache], config, num_blocks=256)
    s.fill_index_cache(indexer.k_cache.kv_cache, seed=20)
    requests = [s.Request(3000, 1), s.Request(700, 1), s.Request(1500, 120), s.Request(200, 200)]
    table = s.block_table(requests, s.V32_BLOCK, V32_WIDTH, num_blocks=256, seed=21)
    spec = indexer.k_cache.get_kv_cache_spec(config)
    with set_current_vllm_config(config):
        builder = backend_cls.get_builder_cls()(
            spec, [indexer.k_cache.prefix], config, torch.device("cpu"), block_table_width=V32_WIDTH
        )
    metadata = builder.build(0, s.common_metadata(requests, table, s.V32_BLOCK))
    rows = s.visible_rows(requests, 1)
    q, w = s.queries(len(rows), seed=22)
    with s.workspace_manager(), set_forward_context({indexer.k_cache.prefix: metadata}, config):
        out = v32_call(indexer, q, w, torch.empty((len(rows), 1)))
    assert out is indexer.topk_indices_buffer
    s.assert_matches_reference(out[: len(rows)], q, w, indexer.k_cache.kv_cache, table, rows)


def test_v32_layers_with_an_unsupported_config_keep_vllms_op(gpu_ok):
    config = s.make_config(max_model_len=V32_MAX_MODEL_LEN, block_size=s.V32_BLOCK)
    assert indexer_hooks.install()
    config.parallel_config.prefill_context_parallel_size = 2
    assert not indexer_hooks.install(config)
    config.parallel_config.prefill_context_parallel_size = 1
    config.attention_config.indexer_kv_dtype = "mxfp4"
    indexer = v32_indexer(config, "model.layers.1.self_attn.indexer")
    assert type(indexer) is v32.DeepseekV32Indexer
    assert isinstance(indexer.indexer_op, SparseAttnIndexer)
    assert indexer.indexer_op.b12x is None  # vLLM's own op, vLLM's own set-up


def test_v32_dispatcher_passes_other_layers_to_vllm():
    calls = []
    dispatch = backend.make_v32_dispatcher(lambda *a, **k: calls.append((a, k)) or "vllm")
    args = (None, "not.a.b12x.layer", None, None, None, None, None, 128)
    assert dispatch(*args, topk_backend="auto") == "vllm"
    assert calls == [(args, {"topk_backend": "auto"})]


# --- never slower for a vLLM user (issue 19, item 3) -------------------------------------


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0), (12, 0), (12, 1), (7, 5)])
def test_the_speed_rules_deepgemm_architectures_are_vllms_own(monkeypatch, capability):
    import sys
    import types

    from b12x.integration.vllm import speed_rule
    from vllm.platforms.interface import DeviceCapability

    # vLLM's CUDA platform module loads its compiled ops first (no libcuda here);
    # its support_deep_gemm() is plain Python over the device capability
    monkeypatch.setitem(
        sys.modules, "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch")
    )
    from vllm.platforms.cuda import CudaPlatform

    def capability_of(cls, device_id=0):
        return DeviceCapability(*capability)

    monkeypatch.setattr(CudaPlatform, "get_device_capability", classmethod(capability_of))
    decision = speed_rule.decide(capability, "exact", True, figures={})
    assert ("vLLM runs none on" in decision.reason) is not CudaPlatform.support_deep_gemm()


# sm_89: vLLM runs no DeepGEMM there; sm_90: as the committed figures say
# (None); sm_120: no figures, so not shown at least as fast.
@pytest.mark.parametrize(("capability", "b12x"), [((8, 9), True), ((9, 0), None), ((12, 0), False)])
def test_layers_keep_vllms_indexer_where_the_rule_does_not_choose_b12x(
    monkeypatch, caplog, capability, b12x
):
    from b12x.integration.vllm import speed_rule

    if b12x is None:
        b12x = speed_rule.decide(capability, speed_rule.PLAN_PRECISION, True).use_b12x

    # the GPU is the stand-in: its kernels run, its architecture is `capability`,
    # vLLM has DeepGEMM
    monkeypatch.setattr(speed_rule, "stock_fast_path", lambda inside_vllm: True)
    monkeypatch.setattr(
        indexer_hooks, "_device_reason", lambda: indexer_hooks._speed_reason(capability)
    )
    config = s.make_config()
    with caplog.at_level(logging.INFO, logger="b12x.integration.vllm"):
        assert indexer_hooks.install(config) is b12x
        reason = indexer_hooks.install_reason(config)  # the same answer, logged once
    if b12x:  # vLLM runs no DeepGEMM on sm_89: b12x is the only fast path there
        cls = DeepseekV4Attention._get_indexer_cls(None, config)
        assert cls is backend.B12xDeepseekV4Indexer
        assert reason is None
        return
    arch = f"sm_{capability[0]}{capability[1]}"
    assert arch in reason and "stock" in reason
    logged = [r.getMessage() for r in caplog.records if "b12x indexer not used" in r.getMessage()]
    assert logged == [f"b12x indexer not used: {reason}; vLLM's own indexer runs"]
    assert DeepseekV4Attention._get_indexer_cls(None, config) is DeepseekV4Indexer
