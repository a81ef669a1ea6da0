"""dsa_indexer.plan: interning, bucketed capacities, routes, scratch specs and layout math."""

from __future__ import annotations

import math

import b12x
import pytest
import torch
from b12x import _core
from b12x import cuda as b12x_cuda
from b12x.attention import dsa_indexer as di


def caps(**kw):
    base = {
        "device": "cpu",
        "num_q_heads": 64,
        "max_q_rows": 16,
        "max_page_table_width": 1024,
        "topk": 512,
    }
    return di.Caps(**{**base, **kw})


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    di.clear_caches()
    yield
    di.clear_caches()


def bucket(n: int) -> int:
    """The documented rule, independently: exact to 8, then m*2^k, m in {4,5,6,7}."""
    if n <= 8:
        return n
    k = n.bit_length() - 3
    return -(-n // 2**k) * 2**k


def test_equal_caps_give_the_same_plan_object():
    a, b = caps(), caps()
    assert a is not b
    p = di.plan(a)
    assert di.plan(a) is p
    assert di.plan(b) is p
    assert di.cached_plan_count() == 1
    assert di.plan(caps(topk=1024)) is not p
    assert di.cached_plan_count() == 2


def test_caps_in_one_bucket_share_a_plan_and_report_its_capacity():
    c9, c10 = caps(max_q_rows=9, max_page_table_width=1025), caps(max_q_rows=10)
    p = di.plan(c9)
    assert p is di.plan(caps(max_q_rows=10, max_page_table_width=1280))
    assert (p.max_q_rows, p.max_page_table_width) == (10, 1280)
    assert (p.caps.max_q_rows, p.caps.max_page_table_width) == (10, 1280)
    assert (c9.max_q_rows, c9.max_page_table_width) == (9, 1025)  # Caps keep what was passed
    assert di.plan(c10) is not p  # width 1024 is its own bucket


def test_vllm_profile_width_stays_exact():
    # _reserve_profile_workspace: max_page_table_width = ceil(65536 / 64)
    c = caps(max_page_table_width=math.ceil(65536 / di.PAGED_INDEX_PAGE_SIZE))
    assert c.max_page_table_width == 1024
    assert di.plan(c).max_page_table_width == 1024


def test_bucket_rule_matches_the_documented_one():
    for rows in [*range(1, 70), 100, 129, 1000, 4096, 4097, 65535, 2**20]:
        assert di.plan(caps(max_q_rows=rows)).max_q_rows == bucket(rows), rows


def test_plan_count_stays_bounded_over_many_live_sizes():
    # a prefill server: every chunk size 1..2048 rows, page widths 1..300
    for rows in range(1, 2049):
        p = di.plan(caps(mode="prefill", max_q_rows=rows, max_page_table_width=1 + rows % 300))
        assert rows <= p.max_q_rows <= max(rows, 8) * 1.25
        assert p.max_page_table_width >= 1 + rows % 300
    row_buckets = len({bucket(r) for r in range(1, 2049)})
    width_buckets = len({bucket(w) for w in range(1, 301)})
    assert row_buckets == 8 + 4 * 8
    assert di.cached_plan_count() <= row_buckets * width_buckets
    # the same sizes again create nothing new
    before = di.cached_plan_count()
    for rows in range(1, 2049, 7):
        di.plan(caps(mode="prefill", max_q_rows=rows, max_page_table_width=1 + rows % 300))
    assert di.cached_plan_count() == before


def test_clear_caches_forgets_plans_but_handed_out_ones_stay_valid():
    c = caps()
    p = di.plan(c)
    di.clear_caches()
    assert di.cached_plan_count() == 0
    q = di.plan(c)
    assert q is not p
    assert (q.nbytes, q.route, q.max_chunks) == (p.nbytes, p.route, p.max_chunks)


def test_uncached_build_makes_a_new_plan_every_call():
    c = caps()
    assert _core.indexer_build_plan(c) is not _core.indexer_build_plan(c)
    assert di.cached_plan_count() == 0


def test_routes_follow_the_mode():
    d, p = di.plan(caps()), di.plan(caps(mode="prefill"))
    assert (d.route, d.mode, d.shared_page_table) == ("paged_decode", "decode", False)
    assert (p.route, p.mode, p.shared_page_table) == ("packed_contiguous", "prefill", True)
    assert p.layout.route == p.route


def test_cpu_plan_facts():
    p = di.plan(caps(num_q_heads=17, output_index_space="physical"))
    assert p.device == torch.device("cpu")
    assert (p.num_q_heads, p.heads_padded, p.multiprocessors) == (17, 32, 1)
    assert (p.topk, p.output_index_space) == (512, "physical")
    assert repr(p).startswith("Plan(route=paged_decode, device=cpu, num_q_heads=17")


def test_plans_are_frozen():
    p = di.plan(caps())
    with pytest.raises(AttributeError):
        p.route = "x"
    with pytest.raises(AttributeError):
        p.layout.nbytes = 1


def test_scratch_specs_and_shapes_and_dtypes():
    p = di.plan(caps())
    (spec,) = p.scratch_specs()
    assert spec.name == "paged_indexer.scratch" == di.SCRATCH_NAME
    assert spec.shape == (p.nbytes,) and spec.nbytes == p.nbytes
    assert spec.dtype is torch.uint8 and spec.device == torch.device("cpu")
    assert p.shapes_and_dtypes() == (((p.nbytes,), torch.uint8),)
    # what vLLM's workspace manager does with it
    ((shape, dtype),) = p.shapes_and_dtypes()
    assert torch.empty(shape, dtype=dtype).numel() == p.nbytes


REGIONS = [
    "logits",
    "carry_values",
    "carry_indices",
    "partial_values",
    "partial_indices",
    "select_candidates",
    "row_state",
]


def test_layout_regions_are_aligned_ordered_and_typed():
    p = di.plan(caps(max_q_rows=3, max_page_table_width=16, supertile_tokens=512))
    layout = p.layout
    assert list(layout) == REGIONS == list(layout.keys())
    assert len(layout) == 7 and "logits" in layout and "nope" not in layout
    expect = {
        "logits": (torch.float32, (3, 512)),
        "carry_values": (torch.float32, (2, 3, 512)),
        "carry_indices": (torch.int32, (2, 3, 512)),
        # one top-k slice (a CPU plan has one "SM"): no partial lists
        "partial_values": (torch.float32, (0,)),
        "partial_indices": (torch.int32, (0,)),
        # only plans that may run the grid selection gather its candidates
        "select_candidates": (torch.int64, (0,)),
        "row_state": (torch.int32, (3, 16)),
    }
    end = 0
    for name, region in layout.items():
        assert region is layout[name] and region is layout.get(name)
        assert (region.dtype, region.shape) == expect[name]
        assert region.offset % 1024 == 0 and region.offset >= end
        assert region.numel == math.prod(region.shape)
        assert region.nbytes == region.numel * region.dtype.itemsize
        end = region.offset + region.nbytes
    assert layout.nbytes == p.nbytes == max(end, 1024)
    assert [r.name for r in layout.regions] == REGIONS == [r.name for r in layout.values()]
    # one chunk, few rows: only a CUDA decode plan holds the grid selection's
    # row state (rust/core's plan tests); a CPU plan never runs it
    one_chunk = di.plan(caps(max_q_rows=3, max_page_table_width=16, supertile_tokens=1024))
    assert one_chunk.max_chunks == 1
    assert one_chunk.layout["row_state"].shape == (3, 16)
    assert layout.get("nope") is None and layout.get("nope", 5) == 5
    with pytest.raises(KeyError, match='no scratch region "nope"'):
        layout["nope"]


def test_spec_pinned_layout_examples():
    # reference §4.4: H=64, R=2, W=16, K=512, explicit S=512 -> 2 chunks
    p = di.plan(caps(max_q_rows=2, max_page_table_width=16, supertile_tokens=512))
    assert (p.supertile_tokens, p.max_chunks) == (512, 2)
    assert (p.layout.supertile_tokens, p.layout.max_chunks) == (512, 2)
    assert p.layout["logits"].shape == (2, 512)
    # (R=16, W=1056, S=8192): carries keep two halves whatever the chunk count
    p = di.plan(caps(max_q_rows=16, max_page_table_width=1056, supertile_tokens=8192))
    assert p.max_page_table_width == 1280 and p.max_chunks == 10
    assert p.layout["carry_values"].shape[0] == p.layout["carry_indices"].shape[0] == 2


def test_default_supertile_and_chunks():
    # prefill: the width, up to 32768 K rows per chunk
    for width, (supertile, chunks) in {
        1: (512, 1),
        8: (512, 1),
        9: (1024, 1),
        512: (32768, 1),
        513: (32768, 2),
        1024: (32768, 2),
        4096: (32768, 8),
    }.items():
        p = di.plan(caps(max_page_table_width=width, mode="prefill"))
        assert (p.supertile_tokens, p.max_chunks) == (supertile, chunks), width
        assert p.max_chunks == math.ceil(p.max_page_table_width * 64 / p.supertile_tokens)
    # decode: the whole width while rows x supertile f32 logits fit 32 MiB
    for rows, width, supertile in [(16, 513, 40960), (16, 4096, 262144), (64, 4096, 131072),
                                   (1024, 4096, 32768), (4096, 512, 32768)]:  # fmt: skip
        p = di.plan(caps(max_q_rows=rows, max_page_table_width=width))
        assert p.supertile_tokens == supertile, (rows, width)
        assert p.max_chunks == math.ceil(p.max_page_table_width * 64 / p.supertile_tokens)


def expected_nbytes(rows: int, topk: int, supertile: int) -> int:
    sizes = [rows * supertile * 4, 2 * rows * topk * 4, 2 * rows * topk * 4, rows * 16 * 4]
    off = 0
    for size in sizes[:-1]:
        off = -(-(off + size) // 1024) * 1024
    return max(off + sizes[-1], 1024)


def test_scratch_scales_with_rows_and_with_width_up_to_one_supertile():
    for mode in ("decode", "prefill"):
        for rows in (1, 2, 7, 64, 4096):
            for width in (1, 100, 512, 4096):
                for topk in (512, 2048):
                    p = di.plan(
                        caps(max_q_rows=rows, max_page_table_width=width, topk=topk, mode=mode)
                    )
                    assert p.nbytes == expected_nbytes(rows, topk, p.supertile_tokens)

    def n(r, w, m="prefill"):
        return di.plan(caps(max_q_rows=r, max_page_table_width=w, mode=m)).nbytes

    # linear in rows: every region is rows x (a row's bytes), rounded to 1 KiB
    assert abs(n(128, 4096) - 2 * n(64, 4096)) <= 3 * 1024
    assert n(2, 4096) > n(1, 4096) and n(1, 512) == n(1, 4096) and n(1, 64) < n(1, 512)
    # prefill R=1, W=4096, K=512: 128 KiB of logits + 2 x 4 KiB carries + 64 B of row state
    assert n(1, 4096) == 131072 + 4096 + 4096 + 64
    # decode logits stay within max(32 MiB, rows x 32768 x 4): a profile plan
    # for the most rows also covers every plan with fewer rows
    for rows in (1, 8, 64, 256, 1024):
        logits = rows * di.plan(caps(max_q_rows=rows, max_page_table_width=16384)).supertile_tokens
        assert logits * 4 <= max(32 << 20, rows * 32768 * 4)


@pytest.mark.skipif(b12x_cuda.is_available(), reason="checks the no-driver error path")
def test_cuda_caps_without_a_device_are_refused_and_nothing_is_cached():
    # refused when the caps are made: no CUDA device is visible to this process
    with pytest.raises(b12x.DeviceError, match=r"^Caps: device expected a CUDA device this pro"):
        di.plan(caps(device="cuda:0"))
    assert di.cached_plan_count() == 0


@pytest.mark.gpu
def test_cuda_plan_loads_kernels_and_reads_the_sm_count():
    p = di.plan(caps(device="cuda:0"))
    assert _core.kernels_loaded(0)
    assert p.multiprocessors == _core.device_info(0)["multiprocessors"]
    assert p.device == torch.device("cuda", 0)
    assert p.scratch_specs()[0].device == torch.device("cuda", 0)
