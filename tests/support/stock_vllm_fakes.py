"""CPU stand-ins for the stock vLLM indexer's GPU pieces, for the bench's peer-arm tests.

``FakeDeepGemm`` takes DeepGEMM's three indexer calls with the argument
contract vLLM's wrappers document (``vllm/utils/deep_gemm.py``) and asserts
it: shapes, dtypes, the 4-D ``[pages, 64, 1, 132]`` cache view, 2-D
``context_lens``, a unit-stride block table, a ``None`` Q scale. It computes
float32 logits from the cache bytes in vLLM's page layout (64 rows of 128
FP8 values, then their 64 float32 scales) and, like DeepGEMM, leaves the
columns past each row's length uncleaned (NaN here, so a consumer that
reads them shows it). ``FakeVllmOps`` are vLLM's top-k and K-gather ops
with the same signatures, in PyTorch.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

PAGE = 64
DIM = 128
ROW = DIM + 4


def _planar_pages(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K values ``[pages, 64, 128]`` (float) and scales ``[pages, 64]`` of a cache view."""
    pages = cache.shape[0]
    flat = cache.reshape(pages, PAGE * ROW)
    k = flat[:, : PAGE * DIM].contiguous().view(torch.float8_e4m3fn).float()
    s = flat[:, PAGE * DIM :].contiguous().view(torch.float32)
    return k.reshape(pages, PAGE, DIM), s.reshape(pages, PAGE)


def _row_logits(q: torch.Tensor, w: torch.Tensor, k: torch.Tensor, s: torch.Tensor):
    dots = q.float() @ k.T  # [heads, tokens]
    return (torch.relu(dots) * w[:, None]).sum(0) * s


class FakeDeepGemm:
    __version__ = "fake"
    __file__ = "stock_vllm_fakes.py"

    def __init__(self, *, ignore_scales: bool = False) -> None:
        self.ignore_scales = ignore_scales  # a wrong call the logits check must catch
        self.pdl: bool | None = None
        self.calls: list[str] = []
        self.outputs: list[torch.Tensor] = []  # every logits tensor returned, in order

    def set_pdl(self, on: bool) -> None:
        self.pdl = on

    def get_paged_mqa_logits_metadata(self, context_lens, block_size, num_sms):
        self.calls.append("metadata")
        assert context_lens.dtype == torch.int32 and context_lens.dim() == 2, context_lens.shape
        assert block_size == PAGE and isinstance(num_sms, int)
        return torch.zeros((num_sms + 1, 2), dtype=torch.int32)

    def fp8_fp4_paged_mqa_logits(
        self, q, kv_cache, weights, context_lens, block_table, schedule, max_model_len,
        indices=None,
    ):  # fmt: skip
        self.calls.append("paged_logits")
        q_fp, q_sf = q
        assert q_sf is None and indices is None
        assert q_fp.dtype == torch.float8_e4m3fn and q_fp.dim() == 4 and q_fp.shape[3] == DIM
        batch, next_n, heads, _ = q_fp.shape
        assert kv_cache.dtype == torch.uint8 and tuple(kv_cache.shape[1:]) == (PAGE, 1, ROW)
        assert weights.dtype == torch.float32 and tuple(weights.shape) == (batch * next_n, heads)
        assert context_lens.dtype == torch.int32
        assert tuple(context_lens.shape) == (batch, next_n)
        assert block_table.dtype == torch.int32 and block_table.shape[0] == batch
        assert block_table.stride(-1) == 1
        assert schedule.dtype == torch.int32 and schedule.shape[1] == 2
        k, s = _planar_pages(kv_cache)
        if self.ignore_scales:
            s = torch.ones_like(s)
        out = torch.full((batch * next_n, max_model_len), math.nan)
        for b in range(batch):
            length = int(context_lens[b, 0])
            pids = block_table[b, : -(-length // PAGE)].long()
            kk = k[pids].reshape(-1, DIM)[:length]
            ss = s[pids].reshape(-1)[:length]
            out[b, :length] = _row_logits(q_fp[b, 0], weights[b], kk, ss)
        self.outputs.append(out)
        return out

    def fp8_fp4_mqa_logits(self, q, kv, weights, ks, ke, max_seqlen_k):
        self.calls.append("ragged_logits")
        q_fp, q_sf = q
        k, sf = kv
        assert q_sf is None and q_fp.dtype == torch.float8_e4m3fn and q_fp.dim() == 3
        rows, heads, _ = q_fp.shape
        assert k.dtype == torch.float8_e4m3fn and k.dim() == 2 and k.shape[1] == DIM
        assert sf.dtype == torch.float32 and tuple(sf.shape) == (k.shape[0],)
        assert tuple(weights.shape) == (rows, heads) and weights.dtype == torch.float32
        assert ks.dtype == ke.dtype == torch.int32 and ks.shape == ke.shape == (rows,)
        assert isinstance(max_seqlen_k, int)
        scales = torch.ones_like(sf) if self.ignore_scales else sf
        out = torch.full((rows, max_seqlen_k), math.nan)
        for i in range(rows):
            a, e = int(ks[i]), int(ke[i])
            out[i, : e - a] = _row_logits(q_fp[i], weights[i], k[a:e].float(), scales[a:e])
        self.outputs.append(out)
        return out


def _masked(logits: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    cols = torch.arange(logits.shape[1])
    return logits.masked_fill(cols[None, :] >= ends.reshape(-1)[:, None], -math.inf)


class FakeVllmOps:
    """vLLM's compiled ops (same signatures), recording their calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _radix(self, name, logits, seq_lens, out, workspace, topk, max_seq_len):
        self.calls.append(name)
        assert seq_lens.dtype == torch.int32 and seq_lens.dim() == 2
        assert workspace.dtype == torch.uint8 and workspace.numel() == 1024 * 1024
        assert isinstance(max_seq_len, int) and isinstance(topk, int)
        out.copy_(_masked(logits, seq_lens).topk(topk, dim=1).indices)

    def cooperative_topk(self, *args):
        self._radix("cooperative_topk", *args)

    def persistent_topk(self, *args):
        self._radix("persistent_topk", *args)

    def top_k_per_row_prefill(self, logits, starts, ends, out, rows, stride0, stride1, topk):
        self.calls.append("top_k_per_row_prefill")
        assert (stride0, stride1) == logits.stride() and rows == logits.shape[0]
        assert int(starts.abs().sum()) == 0  # DeepGEMM's ragged rows start at column 0
        out.copy_(_masked(logits, ends).topk(topk, dim=1).indices)

    def cp_gather_indexer_k_quant_cache(self, kv_cache, k, k_scale, block_table, cu_seq_lens):
        self.calls.append("cp_gather_indexer_k_quant_cache")
        assert kv_cache.dim() == 3 and tuple(kv_cache.shape[1:]) == (PAGE, ROW)
        assert k_scale.dtype == torch.uint8 and k_scale.shape[1] == 4
        assert block_table.shape[0] == cu_seq_lens.shape[0] - 1
        pages = kv_cache.shape[0]
        flat = kv_cache.reshape(pages, PAGE * ROW)
        for r in range(block_table.shape[0]):
            a, e = int(cu_seq_lens[r]), int(cu_seq_lens[r + 1])
            pids = block_table[r, : -(-(e - a) // PAGE)].long()
            sel = flat[pids]
            k.view(torch.uint8)[a:e] = sel[:, : PAGE * DIM].reshape(-1, DIM)[: e - a]
            k_scale[a:e] = sel[:, PAGE * DIM :].reshape(-1, 4)[: e - a]

    def namespace(self, ns: str) -> SimpleNamespace:
        names = {
            "_C": ["cooperative_topk", "persistent_topk", "top_k_per_row_prefill"],
            "_C_cache_ops": ["cp_gather_indexer_k_quant_cache"],
        }[ns]
        return SimpleNamespace(**{n: getattr(self, n) for n in names})
