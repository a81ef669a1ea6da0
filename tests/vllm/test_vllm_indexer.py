"""The C4 sparse indexer adapter, without vLLM and without a GPU: the library
module is the real ``b12x.attention.dsa_indexer`` (CPU reference run), wrapped
to count plan/bind/run calls."""

from __future__ import annotations

from types import SimpleNamespace

import b12x
import pytest
import torch
import vllm_fakes as fakes
from b12x.attention import dsa_indexer
from b12x.integration.vllm import C4SparseIndexer, DeepseekV4B12xSparseIndexer, speed_rule
from b12x.integration.vllm import indexer as indexer_mod
from vllm_fakes import (
    CacheHolder,
    CountingIndexer,
    DecodeMetadata,
    ForwardContext,
    IndexerMetadata,
    PrefillChunk,
    Workspace,
)

TOPK = 512
SENTINEL = -5  # never a valid index (valid: >= -1)
HEADS = 16
CAPS_FIELDS = {"device", "num_q_heads", "max_q_rows", "max_page_table_width", "topk", "mode"}


@pytest.fixture
def module(monkeypatch):
    counting = CountingIndexer(dsa_indexer)
    monkeypatch.setattr(indexer_mod, "_dsa_indexer", lambda: counting)
    return counting


@pytest.fixture
def workspace(monkeypatch):
    ws = Workspace()
    fakes.install_vllm(monkeypatch, ws)
    return ws


def make_indexer(cache=None, buffer_rows=8, max_model_len=128, **overrides):
    cache = torch.zeros((4, 64, 132), dtype=torch.uint8) if cache is None else cache
    options = dict(
        k_cache=CacheHolder(cache),
        quant_block_size=128,
        scale_fmt="ue8m0",
        topk_tokens=TOPK,
        head_dim=128,
        max_model_len=max_model_len,
        max_total_seq_len=max_model_len,
        topk_indices_buffer=torch.full((buffer_rows, TOPK), SENTINEL, dtype=torch.int32),
        skip_k_cache_insert=True,
        compress_ratio=4,
    )
    options.update(overrides)
    return C4SparseIndexer(**options)


def q_and_weights(rows, heads=HEADS, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn((rows, heads, 128), generator=g).to(torch.float8_e4m3fn)
    w = torch.rand((rows, heads, 1), generator=g, dtype=torch.float32)
    return q, w


def seed_inputs(rows=3):
    q, w = q_and_weights(rows)
    return {
        "q": q,
        "weights": w,
        "kv_cache": torch.zeros((4, 64, 132), dtype=torch.uint8),
        "seq_lens": torch.full((rows,), 128, dtype=torch.int32),
        "block_table": torch.zeros((rows, 2), dtype=torch.int32),
        "output": torch.full((rows, TOPK), SENTINEL, dtype=torch.int32),
        "shared_page_table": True,
    }


def caps_fields(caps):
    if hasattr(caps, "__dataclass_fields__"):
        return set(caps.__dataclass_fields__)
    return {name for name in dir(caps) if not name.startswith("_")}


# --- the seed's qualifying tests -----------------------------------------------------------


def test_reuses_plans_and_rebinds_shared_workspace(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()

    indexer.run_paged_topk(**inputs)
    indexer.run_paged_topk(**inputs)

    assert module.distinct_plans() == 1  # interned: one plan serves both calls
    assert workspace.calls == 2
    assert module.calls["bind"] == 2
    assert module.calls["run"] == 2
    (plan_a, first), (plan_b, second) = module.binds
    assert plan_a is plan_b
    assert first["scratch"] is not second["scratch"]  # fresh views per call
    assert workspace.requests[0] == tuple(plan_a.shapes_and_dtypes())
    assert torch.count_nonzero(inputs["output"] == SENTINEL) == 0  # run wrote every slot


def test_logical_slot_contract(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    scores = torch.empty((3, TOPK), dtype=torch.float32)
    active_width = torch.full((1,), 128, dtype=torch.int32)

    indexer.run_paged_topk(**inputs, scores=scores, active_width=active_width)

    (plan, bound) = module.binds[0]
    assert bound["output_indices"] is inputs["output"]
    assert bound["output_scores"] is scores
    assert bound["active_width"] is active_width
    # A shared (prefill) table is read through its first row, stride 0: no copy.
    assert bound["page_table"].stride() == (0, 1)
    assert bound["page_table"].data_ptr() == inputs["block_table"].data_ptr()
    assert bound["cache_lengths"] is inputs["seq_lens"]
    assert bound["q_fp8"] is inputs["q"]
    # untouched before run
    assert torch.count_nonzero(module.outputs_before_run[0] != SENTINEL) == 0
    assert torch.count_nonzero(inputs["output"] == SENTINEL) == 0
    caps = module.caps[0]
    assert caps.mode == "prefill"
    assert getattr(caps, "output_index_space", "logical") == "logical"
    assert plan.route == indexer_mod.PREFILL_ROUTE


def test_profile_reservation_at_max_model_len(module, workspace):
    indexer = make_indexer(max_model_len=65536, buffer_rows=2)
    q, _ = q_and_weights(2, heads=64)

    indexer.reserve_profile_workspace(q)

    assert workspace.calls == 2
    assert [c.mode for c in module.caps] == ["decode", "prefill"]
    for caps in module.caps:
        assert caps.max_page_table_width == 1024
        assert caps.max_q_rows == 2
        assert caps.num_q_heads == 64
        assert caps.topk == TOPK
        assert "source_layout" not in caps_fields(caps)
        assert "shared_page_table" not in caps_fields(caps)
    assert workspace.nbytes >= max(p.nbytes for p in module.plans)
    assert module.calls["bind"] == module.calls["run"] == 0  # reserves, computes nothing


@pytest.mark.parametrize("precision", ["exact", "fast"])
def test_plans_are_made_at_the_precision_the_speed_rule_compares(
    module, workspace, monkeypatch, precision
):
    monkeypatch.setattr(speed_rule, "PLAN_PRECISION", precision)
    make_indexer().reserve_profile_workspace(q_and_weights(2)[0])
    assert [c.precision for c in module.caps] == [precision, precision]
    assert [p.precision for p in module.plans] == [precision, precision]


def test_profile_run_reserves_through_forward(module, monkeypatch):
    ws = Workspace()
    context = ForwardContext(attn_metadata=None, batch_descriptor=object())
    fakes.install_vllm(monkeypatch, ws, context)
    indexer = make_indexer(max_model_len=65536)
    q, w = q_and_weights(4)

    assert indexer(None, q, None, w) is indexer.topk_indices_buffer
    assert ws.calls == 2

    context.cudagraph_runtime_mode = "FULL"  # a capture-time dummy run reserves nothing
    indexer(None, q, None, w)
    context.cudagraph_runtime_mode, context.batch_descriptor = "NONE", None
    indexer(None, q, None, w)
    assert ws.calls == 2
    assert torch.count_nonzero(indexer.topk_indices_buffer != SENTINEL) == 0


# --- forward: prefill chunks and decode rows ----------------------------------------------


def forward_batch():
    """Two decode tokens (one request, MTP next_n=2) then two prefill requests."""
    decode = DecodeMetadata(
        seq_lens=torch.tensor([[70, 71]], dtype=torch.int32),
        block_table=torch.tensor([[2, 3, -1]], dtype=torch.int32),
    )
    chunks = [
        PrefillChunk(
            token_start=2,
            token_end=5,
            cu_seqlen_ks=torch.zeros(3, dtype=torch.int32),
            cu_seqlen_ke=torch.tensor([20, 21, 22], dtype=torch.int32),
            total_seq_lens=22,
            block_table=torch.tensor([[1, -1, -1]], dtype=torch.int32),
        ),
        PrefillChunk(
            token_start=5,
            token_end=7,
            cu_seqlen_ks=torch.tensor([0, 0], dtype=torch.int32),
            cu_seqlen_ke=torch.tensor([129, 130], dtype=torch.int32),
            total_seq_lens=130,
            block_table=torch.tensor([[0, 2, 3]], dtype=torch.int32),
        ),
    ]
    return IndexerMetadata(
        num_decode_tokens=2, decode=decode, prefill=fakes.prefill_metadata(chunks)
    )


def test_forward_runs_prefill_per_request_and_decode_per_token(module, monkeypatch):
    ws = Workspace()
    indexer = make_indexer()
    metadata = forward_batch()
    context = ForwardContext(attn_metadata={indexer.k_cache.prefix: metadata})
    fakes.install_vllm(monkeypatch, ws, context)
    q, w = q_and_weights(7)

    out = indexer(None, q, None, w)

    assert out is indexer.topk_indices_buffer
    assert module.calls["run"] == ws.calls == 3
    (_, first), (_, second), (_, decode) = module.binds
    assert [c.mode for c in module.caps] == ["prefill", "prefill", "decode"]
    # Prefill: one request per chunk, its page-table row shared (stride 0) by all its rows.
    assert first["page_table"].shape == (3, 1) and first["page_table"].stride() == (0, 1)
    assert second["page_table"].shape == (2, 3) and second["page_table"].stride() == (0, 1)
    assert second["page_table"][1].tolist() == [0, 2, 3]
    assert first["cache_lengths"].tolist() == [20, 21, 22]
    assert second["cache_lengths"].tolist() == [129, 130]
    assert torch.equal(first["q_fp8"].float(), q[2:5].float())
    assert first["output_indices"].data_ptr() == out[2:5].data_ptr()
    assert second["output_indices"].data_ptr() == out[5:7].data_ptr()
    # Decode: one page-table row per token (the request's row repeated for MTP).
    assert decode["page_table"].tolist() == [[2, 3, -1], [2, 3, -1]]
    assert decode["cache_lengths"].tolist() == [70, 71]
    assert decode["output_indices"].data_ptr() == out[:2].data_ptr()
    assert torch.count_nonzero(out[:7] == SENTINEL) == 0
    assert torch.count_nonzero(out[7:] != SENTINEL) == 0  # rows past the batch untouched


def test_active_width_is_computed_on_device_into_one_buffer(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["seq_lens"] = torch.tensor([5, 100, 90], dtype=torch.int32)
    indexer.run_paged_topk(**inputs)
    inputs["seq_lens"] = torch.tensor([5, 300, 90], dtype=torch.int32)  # past 2 pages: clamped
    indexer.run_paged_topk(**inputs)

    first, second = (bound["active_width"] for _, bound in module.binds)
    assert first is second is indexer._active_width
    assert first.dtype == torch.int32 and first.shape == (1,)
    assert first.item() == 128


def test_active_width_tracks_the_lengths(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["seq_lens"] = torch.tensor([5, 100, 90], dtype=torch.int32)
    indexer.run_paged_topk(**inputs)
    assert module.binds[0][1]["active_width"].tolist() == [100]


def test_decode_metadata_active_width_is_passed_through(module, monkeypatch):
    ws = Workspace()
    indexer = make_indexer()
    metadata = forward_batch()
    metadata.prefill = None
    metadata.decode.active_width = torch.tensor([71], dtype=torch.int32)
    fakes.install_vllm(monkeypatch, ws, ForwardContext({indexer.k_cache.prefix: metadata}))
    q, w = q_and_weights(2)
    indexer(None, q, None, w)
    assert module.binds[0][1]["active_width"] is metadata.decode.active_width


def test_equal_geometry_shares_one_plan_across_calls(module, workspace):
    indexer = make_indexer()
    for _ in range(3):
        indexer.run_paged_topk(**seed_inputs())
    assert module.distinct_plans() == 1
    assert module.calls["bind"] == 3


# --- validation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"skip_k_cache_insert": False}, "skip_k_cache_insert expected True"),
        ({"use_fp4_cache": True}, "use_fp4_cache expected False"),
        ({"compress_ratio": 128}, r"compress_ratio expected one of \(1, 4\), got 128"),
        ({"head_dim": 64}, "head_dim expected 128, got 64"),
        ({"topk_indices_buffer": None}, "topk_indices_buffer expected"),
    ],
)
def test_constructor_rejects_unsupported_settings(module, override, match):
    with pytest.raises(b12x.ConfigError, match=match):
        make_indexer(**override)


def test_alias_is_the_same_class():
    assert DeepseekV4B12xSparseIndexer is C4SparseIndexer


def test_missing_library_module_is_a_clear_error(monkeypatch):
    def missing():
        raise ImportError("No module named 'b12x.attention'")

    monkeypatch.setattr(indexer_mod, "_dsa_indexer", missing)
    with pytest.raises(b12x.ConfigError, match="dsa_indexer expected importable"):
        make_indexer()
    assert indexer_mod.b12x_indexer_is_supported() is False


def test_wrong_page_size_is_refused(monkeypatch):
    wrong = fakes.module_copy(dsa_indexer, PAGED_INDEX_PAGE_SIZE=128)
    monkeypatch.setattr(indexer_mod, "_dsa_indexer", lambda: wrong)
    with pytest.raises(b12x.ConfigError, match="PAGED_INDEX_PAGE_SIZE expected 64, got 128"):
        make_indexer()


def test_output_and_scores_are_checked(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["output"] = torch.empty((3, 4), dtype=torch.int32)
    with pytest.raises(b12x.ShapeError, match=r"output expected shape \(3, 512\), got \(3, 4\)"):
        indexer.run_paged_topk(**inputs)
    inputs = seed_inputs()
    with pytest.raises(b12x.ShapeError, match="scores expected shape"):
        indexer.run_paged_topk(**inputs, scores=torch.empty((2, TOPK)))
    with pytest.raises(b12x.DTypeError, match=r"scores expected float32, got torch\.float16"):
        indexer.run_paged_topk(**inputs, scores=torch.empty((3, TOPK), dtype=torch.float16))
    assert module.calls["bind"] == 0


@pytest.mark.parametrize(
    ("cache", "error", "match"),
    [
        (torch.zeros((4, 64, 128), dtype=torch.uint8), b12x.ShapeError, "kv_cache expected shape"),
        (torch.zeros((4, 64, 132), dtype=torch.int8), b12x.DTypeError, "kv_cache expected uint8"),
        (
            torch.zeros((4, 132, 64), dtype=torch.uint8).transpose(1, 2),
            b12x.LayoutError,
            "kv_cache expected page payloads",
        ),
    ],
)
def test_bad_cache_layouts_are_refused(module, workspace, cache, error, match):
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["kv_cache"] = cache
    with pytest.raises(error, match=match):
        indexer.run_paged_topk(**inputs)


def test_padded_page_stride_is_kept_zero_copy():
    storage = torch.zeros((4, 64 * 132 + 16), dtype=torch.uint8)
    cache = storage[:, : 64 * 132].view(4, 64, 132)
    flat = indexer_mod.flatten_index_cache(cache)
    assert flat.shape == (4, 8448)
    assert flat.stride() == (64 * 132 + 16, 1)
    assert flat.data_ptr() == storage.data_ptr()


def test_forward_rejects_what_it_cannot_serve(module, monkeypatch):
    ws = Workspace()
    indexer = make_indexer()
    metadata = forward_batch()
    fakes.install_vllm(monkeypatch, ws, ForwardContext({indexer.k_cache.prefix: metadata}))
    q, w = q_and_weights(7)
    with pytest.raises(b12x.DTypeError, match="q_quant expected an FP8 tensor, got tuple"):
        indexer(None, (q, None), None, w)
    with pytest.raises(b12x.ConfigError, match="k expected None"):
        indexer(None, q, torch.empty(1), w)

    metadata.prefill = None
    metadata.decode.seq_lens = torch.tensor([70, 71, 72], dtype=torch.int32)
    metadata.decode.block_table = torch.zeros((1, 3), dtype=torch.int32)
    with pytest.raises(
        b12x.ShapeError, match=r"one row per decode token \(2\) or per block_table row \(1\)"
    ):
        indexer(None, q, None, w)
    metadata.decode.block_table = torch.zeros((2, 3), dtype=torch.int32)
    metadata.decode.seq_lens = torch.tensor([[70, 71, 72], [5, 6, 7]], dtype=torch.int32)
    with pytest.raises(b12x.ShapeError, match=r"expected 2 tokens \(2 requests x 3\)"):
        indexer(None, q, None, w)


def test_prefill_plan_on_another_route_is_refused(monkeypatch, workspace):
    def plan(caps):
        real = dsa_indexer.plan(caps)
        return SimpleNamespace(route="shared_prefill", shapes_and_dtypes=real.shapes_and_dtypes)

    monkeypatch.setattr(
        indexer_mod, "_dsa_indexer", lambda: fakes.module_copy(dsa_indexer, plan=plan)
    )
    indexer = make_indexer()
    with pytest.raises(
        b12x.ConfigError, match="route expected 'packed_contiguous', got 'shared_prefill'"
    ):
        indexer.run_paged_topk(**seed_inputs())
    assert workspace.calls == 0


def test_importing_the_adapters_does_not_import_vllm():
    import subprocess
    import sys

    code = "import sys, b12x.integration.vllm; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_forward_selection_matches_the_reference(monkeypatch):
    from b12x._demo.model import (
        GrowingWorkspace,
        IndexProjections,
        Shape,
        build_batch,
        check_selection,
        forward_context,
    )

    monkeypatch.setattr(indexer_mod, "_dsa_indexer", lambda: dsa_indexer)
    layer = IndexProjections(Shape(hidden=128, index_heads=16))
    batch = build_batch(layer, dsa_indexer.reference, [300, 2999], [(700, 3)], torch.device("cpu"))
    workspace = GrowingWorkspace(torch.device("cpu"))
    context = forward_context(batch, CacheHolder(batch.cache).prefix)
    indexer = make_indexer(
        cache=batch.cache,
        buffer_rows=5,
        max_model_len=1024,
        workspace_manager=lambda: workspace,
        forward_context=lambda: context,
    )
    out = indexer(None, batch.q_fp8, None, batch.weights)
    check_selection(dsa_indexer.reference, batch, out, TOPK)
    assert int((out[0] >= 0).sum()) == 301 // 4  # C4 causality: (p + 1) // 4 rows visible


def test_capacities_in_one_bucket_share_a_plan(monkeypatch, workspace):
    counting = CountingIndexer(dsa_indexer)
    monkeypatch.setattr(indexer_mod, "_dsa_indexer", lambda: counting)
    indexer = make_indexer(buffer_rows=16)
    for rows in (9, 10):  # one rows bucket: 10
        inputs = seed_inputs(rows)
        inputs["output"] = indexer.topk_indices_buffer[:rows]
        indexer.run_paged_topk(**inputs)
    assert counting.distinct_plans() == 1
    assert counting.plans[0].max_q_rows == 10
    assert [c.max_q_rows for c in counting.caps] == [9, 10]  # the adapter passes live sizes


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_lengths_of_another_dtype_get_b12x_dtype_error(module, workspace, dtype):
    # amax(out=int32) ran before bind and raised torch's own RuntimeError.
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["seq_lens"] = inputs["seq_lens"].to(dtype)
    with pytest.raises(
        b12x.DTypeError,
        match=f"cache_lengths expected dtype int32, got {dtype}".replace(".", r"\."),
    ):
        indexer.run_paged_topk(**inputs)
    assert module.calls["bind"] == 0


def test_lengths_of_another_shape_or_device_are_refused_before_amax(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    inputs["seq_lens"] = inputs["seq_lens"].view(3, 1)
    with pytest.raises(
        b12x.ShapeError, match=r"cache_lengths expected shape \(rows,\), got \(3, 1\)"
    ):
        indexer.run_paged_topk(**inputs)
    inputs["seq_lens"] = [128, 128, 128]
    with pytest.raises(
        b12x.NotATensorError, match="cache_lengths expected an int32 tensor, got list"
    ):
        indexer.run_paged_topk(**inputs)


def test_schedule_metadata_is_accepted_and_unused(module, workspace):
    indexer = make_indexer()
    inputs = seed_inputs()
    out = indexer.run_paged_topk(**inputs, schedule_metadata=torch.zeros((9, 2), dtype=torch.int32))
    assert out is inputs["output"]
    assert "schedule_metadata" not in module.binds[0][1]
