"""The launch chain on a real GPU: eager, and inside a CUDA graph with replay."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x import _core, cuda

pytestmark = pytest.mark.gpu


def test_kernels_load_once_per_device():
    cuda.load_kernels(0)
    assert _core.kernels_loaded(0)
    cuda.load_kernels(0)  # idempotent


def test_fill_topk_padding_eager():
    cuda.load_kernels(0)
    idx = torch.randint(0, 100, (33, 512), dtype=torch.int32, device="cuda")
    sc = torch.randn(33, 512, device="cuda")
    cuda.fill_topk_padding(idx, sc)
    torch.cuda.synchronize()
    assert bool((idx == -1).all())
    assert bool(torch.isneginf(sc).all())


def test_fill_topk_padding_on_a_side_stream_and_without_scores():
    cuda.load_kernels(0)
    idx = torch.zeros(7, 1024, dtype=torch.int32, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        cuda.fill_topk_padding(idx)
    s.synchronize()
    assert bool((idx == -1).all())


def test_fill_topk_padding_graph_capture_and_replay():
    cuda.load_kernels(0)
    idx = torch.zeros(64, 512, dtype=torch.int32, device="cuda")
    sc = torch.zeros(64, 512, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cuda.fill_topk_padding(idx, sc)
    idx.fill_(7)
    sc.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert bool((idx == -1).all())
    assert bool(torch.isneginf(sc).all())


def test_bad_operands_are_rejected_before_launch():
    cuda.load_kernels(0)
    with pytest.raises(b12x.DTypeError, match="indices expected dtype int32"):
        cuda.fill_topk_padding(torch.zeros(4, 4, dtype=torch.int64, device="cuda"))
    idx = torch.zeros(4, 4, dtype=torch.int32, device="cuda")
    with pytest.raises(b12x.ShapeError, match=r"scores expected shape \(4, 4\)"):
        cuda.fill_topk_padding(idx, torch.zeros(4, 5, device="cuda"))
    with pytest.raises(b12x.LayoutError):
        cuda.fill_topk_padding(torch.zeros(4, 8, dtype=torch.int32, device="cuda")[:, ::2])
