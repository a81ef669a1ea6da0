"""tools/gpu/gather_order_probe.py: every order is the same pages, arranged as named."""

from __future__ import annotations

import sys
from itertools import pairwise
from pathlib import Path

import numpy as np

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import gather_order_probe as probe  # noqa: E402

PAGES = probe.ROWS * probe.WIDTH


def test_segments_cover_each_cta_chunk_cut_at_row_ends():
    segs = probe.segments(PAGES, probe.GRID, probe.WIDTH)
    assert segs[0][0] == 0 and segs[-1][1] == PAGES
    assert all(a < b for a, b in segs)
    assert all(b == c for (_, b), (c, _) in pairwise(segs))
    assert all(a // probe.WIDTH == (b - 1) // probe.WIDTH for a, b in segs), "one row each"
    # 248 or 249 pages a CTA over rows of 512: about half the CTAs span two rows
    assert probe.GRID < len(segs) < 2 * probe.GRID


def test_every_order_reads_each_page_once_in_its_named_arrangement():
    orders = probe.orders(np.random.default_rng(7))
    rand = orders["random"]
    for name, table in orders.items():
        assert np.array_equal(np.sort(table), np.arange(PAGES)), name
    assert not np.array_equal(rand, np.sort(rand))
    rows = orders["ascending"].reshape(probe.ROWS, probe.WIDTH)
    assert np.array_equal(rows, np.sort(rand.reshape(probe.ROWS, probe.WIDTH), axis=1))
    for a, b in probe.segments(PAGES, probe.GRID, probe.WIDTH):
        seg = orders["segment_sorted"][a:b]
        assert np.array_equal(seg, np.sort(rand[a:b])), (a, b)
        for n in (16, 64, 256):
            part = orders[f"buckets{n}"][a:b]
            assert np.array_equal(np.sort(part), np.sort(rand[a:b]))
            assert np.all(np.diff(part.astype(np.int64) * n // PAGES) >= 0), (n, a)
    for g in range(probe.GRID):
        a, b = g * PAGES // probe.GRID, (g + 1) * PAGES // probe.GRID
        assert np.array_equal(orders["chunk_sorted"][a:b], np.sort(rand[a:b]))
    assert np.array_equal(orders["identity"], np.arange(PAGES))


def test_every_shape_fits_an_sm_and_cuts_pages_into_whole_copies():
    assert all(probe.shape_fits(*shape) for shape in probe.SHAPES)
    assert probe.shape_fits(1, 24, 1), "the deepest one-CTA ring"
    assert not probe.shape_fits(2, 16, 1), "two 16-stage rings exceed an SM"
    assert not probe.shape_fits(4, 6, 1), "a stage freed by two consumer warps"
    assert not probe.shape_fits(1, 16, 5), "8448 bytes do not cut into 5 copies"
    assert not probe.shape_fits(1, 16, 32), "264-byte copies are not whole 16-byte units"
    assert probe.shape_fits(1, 16, 1, 4), "four issuing warps, four stages each"
    assert not probe.shape_fits(1, 16, 1, 8), "more warps than the kernel's launch bound"
    assert not probe.shape_fits(1, 8, 1, 3), "a stage filled by two issuing warps"
    assert probe.threads(2) == 32 * (2 + probe.CONSUMERS)


def test_sweep_puts_every_ctas_kth_read_in_one_window_of_ids():
    for grid in (probe.GRID, 2 * probe.GRID):
        table = probe.sweep(PAGES, grid)
        assert np.array_equal(np.sort(table), np.arange(PAGES))
        starts = [g * PAGES // grid for g in range(grid)]
        shortest = PAGES // grid
        for k in (0, 57, shortest - 1):
            ids = np.array([table[a + k] for a in starts])
            assert ids.max() - ids.min() == grid - 1, (grid, k)
            assert ids.min() == k * grid, (grid, k)
