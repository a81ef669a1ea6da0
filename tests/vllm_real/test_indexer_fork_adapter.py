"""The voipmonitor vLLM fork's b12x indexer adapter, as a caller of our API.

``vllm/models/deepseek_v4/nvidia/b12x_indexer.py`` in that fork calls only
``Caps``, ``plan``, ``bind``, ``run``, ``Binding``, ``is_supported`` and
``PAGED_INDEX_PAGE_SIZE``, and asserts the prefill route
``"packed_contiguous"`` on plans and bindings. The test below makes the same
calls in the same order (our code, written from its call sequence): its
profile reservation on vLLM's real ``WorkspaceManager``, the lock vLLM puts
on it, then prefill and decode selections on vLLM's real V4 index cache,
compared with vLLM's own reference.
"""

from __future__ import annotations

import indexer_support as s
import pytest
import torch
from b12x.attention import dsa_indexer
from vllm.models.deepseek_v4.attention import DeepseekV4IndexerCache

FORK_PREFILL_ROUTE = "packed_contiguous"
PROFILE_ROWS = 256
MAX_MODEL_LEN = 16384 // 4  # compressed rows, as the fork's caller passes it


def fork_route(obj):
    """The fork's lookup: the object, its ``.layout``, then its ``.plan.layout``."""
    route = getattr(obj, "route", None)
    if route is None:
        route = getattr(getattr(obj, "layout", None), "route", None)
    if route is None:
        route = getattr(getattr(getattr(obj, "plan", None), "layout", None), "route", None)
    return route


def fork_flatten(kv_cache):
    """The fork's zero-copy ``[blocks, 8448]`` view, page stride kept."""
    return kv_cache.as_strided((int(kv_cache.shape[0]), 8448), (int(kv_cache.stride(0)), 1))


def fork_caps(module, q, rows, width, shared, topk=s.TOPK):
    return module.Caps(
        device=q.device,
        num_q_heads=int(q.shape[1]),
        max_q_rows=max(rows, 1),
        max_page_table_width=max(width, 1),
        topk=topk,
        mode="prefill" if shared else "decode",
    )


class ForkCaller:
    """The fork's plan dict, active-width buffer and ``_run_paged_topk``."""

    def __init__(self, module, device):
        self.module = module
        self.plans = {}
        self.active_width = torch.empty((1,), dtype=torch.int32, device=device)

    def plan(self, q, block_table, shared):
        key = (
            q.device,
            int(q.shape[1]),
            max(int(q.shape[0]), 1),
            int(block_table.shape[1]),
            shared,
        )
        if key not in self.plans:
            plan = self.module.plan(
                fork_caps(self.module, q, int(q.shape[0]), int(block_table.shape[1]), shared)
            )
            if shared:
                assert fork_route(plan) == FORK_PREFILL_ROUTE
            self.plans[key] = plan
        return self.plans[key]

    def run(self, manager, q, weights, kv_cache, seq_lens, block_table, output, shared):
        torch.amax(seq_lens, dim=0, keepdim=True, out=self.active_width)
        self.active_width.clamp_(min=0, max=int(block_table.shape[1]) * 64)
        plan = self.plan(q, block_table, shared)
        if shared:
            assert fork_route(plan) == FORK_PREFILL_ROUTE
        scratch = manager.get_simultaneous(*plan.shapes_and_dtypes())
        binding = self.module.bind(
            plan,
            scratch=scratch,
            q_fp8=q,
            query_weights=weights,
            index_k_cache=fork_flatten(kv_cache),
            page_table=block_table,
            cache_lengths=seq_lens,
            active_width=self.active_width,
            output_indices=output,
            output_scores=None,
        )
        assert isinstance(binding, self.module.Binding)
        if shared:
            assert fork_route(binding) == FORK_PREFILL_ROUTE
        self.module.run(binding)


def test_the_forks_calls_run_unmodified_on_vllms_cache_and_locked_workspace():
    config = s.make_config(max_model_len=MAX_MODEL_LEN * 4)
    (layer,) = s.index_cache_layers(DeepseekV4IndexerCache, config, ["l.k_cache"], compress_ratio=4)
    requests = [s.Request(2900, 1), s.Request(1333, 1), s.Request(3000, 150)]
    width = MAX_MODEL_LEN // 64
    table = s.block_table(requests, s.V4_BLOCK, width, num_blocks=64, seed=1)
    s.bind_packed_caches([layer], config, num_blocks=64)
    s.fill_index_cache(layer.kv_cache, seed=2)
    rows = s.visible_rows(requests, 4)
    q, w = s.queries(len(rows), seed=3)
    out = torch.full((len(rows), s.TOPK), -9, dtype=torch.int32)
    # _require_b12x_indexer's checks (is_supported() is True only where the GPU kernels run)
    assert int(dsa_indexer.PAGED_INDEX_PAGE_SIZE) == 64
    assert isinstance(dsa_indexer.is_supported(), bool)
    for name in ("Binding", "Caps", "bind", "plan", "run"):
        getattr(dsa_indexer, name)
    caller = ForkCaller(dsa_indexer, q.device)

    with s.workspace_manager() as manager:
        # _reserve_profile_workspace: decode then prefill plans at the profile rows
        # and the model's width, one get_simultaneous each; then vLLM locks.
        profile_q = torch.empty((PROFILE_ROWS, s.HEADS, 128), dtype=torch.float8_e4m3fn)
        for shared in (False, True):
            plan = dsa_indexer.plan(fork_caps(dsa_indexer, profile_q, PROFILE_ROWS, width, shared))
            if shared:
                assert fork_route(plan) == FORK_PREFILL_ROUTE
            manager.get_simultaneous(*plan.shapes_and_dtypes())
        manager.lock()

        # prefill: one request per chunk, its table row shared by the chunk's rows
        prefill = slice(2, len(rows))
        lengths = torch.tensor([n for _, n in rows[prefill]], dtype=torch.int32)
        active_pages = min(-(-max(n for _, n in rows[prefill]) // 64), width)
        shared_table = table[2:3, :active_pages].expand(prefill.stop - prefill.start, active_pages)
        caller.run(
            manager,
            q[prefill].contiguous(),
            w[prefill].contiguous(),
            layer.kv_cache,
            lengths.contiguous(),
            shared_table,
            out[prefill],
            shared=True,
        )
        # decode: one table row per token
        decode_lens = torch.tensor([n for _, n in rows[:2]], dtype=torch.int32)
        caller.run(
            manager, q[:2], w[:2], layer.kv_cache, decode_lens, table[:2], out[:2], shared=False
        )

    s.assert_matches_reference(out, q, w, layer.kv_cache, table, rows)


@pytest.mark.parametrize("profile_rows", [200, 2048, 8192])
@pytest.mark.parametrize("topk", dsa_indexer.SUPPORTED_TOPK)
def test_the_forks_profile_reservation_covers_every_smaller_call(profile_rows, topk):
    """vLLM locks the workspace after the profile run: any later plan with fewer
    rows or a narrower table must need no more bytes than the profile plans."""
    q = torch.empty((1, 64, 128), dtype=torch.float8_e4m3fn)
    width = -(-65536 // 64)

    def nbytes(rows, pages, shared):
        return dsa_indexer.plan(fork_caps(dsa_indexer, q, rows, pages, shared, topk=topk)).nbytes

    reserved = max(nbytes(profile_rows, width, shared) for shared in (False, True))
    for rows in sorted({1, 7, 9, 100, 127, 128, 129, 199, profile_rows // 2, profile_rows}):
        for pages in (1, 8, 63, 64, 65, 500, 512, 513, width // 2, width):
            for shared in (False, True):
                assert nbytes(rows, pages, shared) <= reserved, (rows, pages, shared)
