"""A miniature DeepSeek V4 C4 layer: index projections, a paged FP8 index cache
and one vLLM-shaped batch of decode rows and one-request prefill chunks.

Shapes follow DeepSeek V4 (64 index heads of 128, top-512, compress ratio 4,
64 compressed rows per page); the hidden size is a parameter so the CPU run
stays small. RoPE and the Hadamard rotation are left out: they change the
values, not the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch

from b12x.attention.dsa_indexer import INDEX_HEAD_DIM
from b12x.attention.dsa_indexer import PAGED_INDEX_PAGE_SIZE as PAGE_SIZE

FP8_MAX = 448.0
COMPRESS_RATIO = 4


@dataclass(frozen=True)
class Shape:
    hidden: int = 7168
    index_heads: int = 64
    head_dim: int = INDEX_HEAD_DIM
    topk: int = 512


class IndexProjections(torch.nn.Module):
    """The index query, per-head weight and index key projections of a C4 layer."""

    def __init__(self, shape: Shape, seed: int = 0) -> None:
        super().__init__()
        h, heads, d = shape.hidden, shape.index_heads, shape.head_dim
        self.shape = shape
        self.wq = torch.nn.Linear(h, heads * d, bias=False)
        self.weights_proj = torch.nn.Linear(h, heads, bias=False)
        self.wk = torch.nn.Linear(h, d, bias=False)
        self.k_norm = torch.nn.LayerNorm(d)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for linear in (self.wq, self.weights_proj, self.wk):
                linear.weight.copy_(torch.randn(linear.weight.shape, generator=g) * h**-0.5)

    @torch.no_grad()
    def queries(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """FP8 index queries ``[rows, heads, 128]`` and float32 weights ``[rows, heads]``.

        Each (row, head) is quantized with its own scale, which moves into the
        weight together with the softmax scale 128^-0.5 and the head scale
        heads^-0.5 (what vLLM's fused q quantizer does).
        """
        heads, d = self.shape.index_heads, self.shape.head_dim
        q = self.wq(x).view(x.shape[0], heads, d).float()
        scale = q.abs().amax(dim=-1, keepdim=True).clamp(min=1e-6) / FP8_MAX
        q_fp8 = (q / scale).to(torch.float8_e4m3fn)
        weights = self.weights_proj(x).float() * scale[..., 0] * d**-0.5 * heads**-0.5
        return q_fp8, weights.contiguous()

    @torch.no_grad()
    def keys(self, compressed: torch.Tensor) -> torch.Tensor:
        """Index K rows (float32 ``[rows, 128]``) of compressed hidden states."""
        keys: torch.Tensor = self.k_norm(self.wk(compressed)).float()
        return keys


@dataclass
class Rows:
    """A run of query rows the indexer selects for, and what to check them against."""

    kind: str  # "decode" or "prefill"
    tokens: slice
    page_table: torch.Tensor  # [rows, width] as the indexer sees it
    lengths: torch.Tensor  # [rows] int32


@dataclass
class Batch:
    q_fp8: torch.Tensor
    weights: torch.Tensor
    cache: torch.Tensor  # uint8 [pages, 64, 132], vLLM's allocation shape
    block_table: torch.Tensor  # int32 [requests, width]
    metadata: Any  # vLLM-shaped indexer metadata
    rows: list[Rows] = field(default_factory=list)
    max_k_rows: int = 0


def _pages(n: int) -> int:
    return max(1, -(-n // PAGE_SIZE))


def build_batch(
    layer: IndexProjections,
    reference: Any,
    decode_positions: list[int],
    prefill_chunks: list[tuple[int, int]],
    device: torch.device,
    seed: int = 1,
) -> Batch:
    """One batch on ``device`` (``layer`` must live there): decode tokens first
    (one request each), then prefill chunks.

    ``decode_positions``: the model position of each decode token; its request
    has written K through it, so it sees ``(p + 1) // 4`` compressed rows.
    ``prefill_chunks``: ``(prompt_tokens, chunk_tokens)``, the chunk being the
    prompt's last tokens; row ``p`` sees ``(p + 1) // 4`` rows (C4 causality).
    """
    g = torch.Generator(device=device).manual_seed(seed)
    requests = [(p + 1) // COMPRESS_RATIO for p in decode_positions]
    requests += [prompt // COMPRESS_RATIO for prompt, _ in prefill_chunks]
    pages_per = [_pages(n) for n in requests]
    total_pages = sum(pages_per)
    width = max(pages_per)

    # Physical pages are scattered, as a paged allocator leaves them.
    pool = torch.randperm(total_pages, generator=g, device=device)
    table = torch.full((len(requests), width), -1, dtype=torch.int32, device=device)
    k_pages = torch.zeros((total_pages, PAGE_SIZE, layer.shape.head_dim), device=device)
    start = 0
    for r, (n, pages) in enumerate(zip(requests, pages_per, strict=True)):
        ids = pool[start : start + pages]
        start += pages
        table[r, :pages] = ids.int()
        k = torch.zeros((pages * PAGE_SIZE, layer.shape.head_dim), device=device)
        for lo in range(0, n, 4096):  # compressed hidden states in slices: bounded memory
            hi = min(n, lo + 4096)
            compressed = torch.randn((hi - lo, layer.shape.hidden), generator=g, device=device)
            k[lo:hi] = layer.keys(compressed)
        k_pages[ids] = k.view(pages, PAGE_SIZE, -1)
    k_fp8, scales = reference.quantize_index_k(k_pages)
    cache = reference.pack_index_k_cache(k_fp8, scales)
    cache = cache.contiguous().view(total_pages, PAGE_SIZE, -1)

    tokens = len(decode_positions) + sum(chunk for _, chunk in prefill_chunks)
    x = torch.randn((tokens, layer.shape.hidden), generator=g, device=device)
    q_fp8, weights = layer.queries(x)

    rows: list[Rows] = []
    decode_n = len(decode_positions)
    decode = None
    if decode_n:
        lengths = torch.tensor(requests[:decode_n], dtype=torch.int32, device=device)
        decode = SimpleNamespace(
            seq_lens=lengths, block_table=table[:decode_n], requires_padding=False
        )
        rows.append(Rows("decode", slice(0, decode_n), table[:decode_n], lengths))
    chunks = []
    token = decode_n
    for i, (prompt, chunk_tokens) in enumerate(prefill_chunks):
        r = decode_n + i
        positions = torch.arange(prompt - chunk_tokens, prompt, device=device)
        lengths = ((positions + 1) // COMPRESS_RATIO).to(torch.int32)
        chunks.append(
            SimpleNamespace(
                num_reqs=1,
                token_start=token,
                token_end=token + chunk_tokens,
                cu_seqlen_ks=torch.zeros(chunk_tokens, dtype=torch.int32, device=device),
                cu_seqlen_ke=lengths,
                total_seq_lens=requests[r],
                block_table=table[r : r + 1],
            )
        )
        active = _pages(requests[r])
        shared = table[r : r + 1, :active].expand(chunk_tokens, active)
        rows.append(Rows("prefill", slice(token, token + chunk_tokens), shared, lengths))
        token += chunk_tokens
    metadata = SimpleNamespace(
        num_decode_tokens=decode_n,
        decode=decode,
        prefill=SimpleNamespace(chunks=chunks) if chunks else None,
    )
    return Batch(q_fp8, weights, cache, table, metadata, rows, max(requests))


class GrowingWorkspace:
    """A shared workspace like vLLM's: one byte buffer, grown on demand, handed
    out as fresh views per request (never grown while a CUDA graph captures)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.buffer = torch.empty(0, dtype=torch.uint8, device=device)
        self.requests = 0

    def get_simultaneous(
        self, *shapes_and_dtypes: tuple[tuple[int, ...], torch.dtype]
    ) -> list[torch.Tensor]:
        self.requests += 1
        sizes = []
        for shape, dtype in shapes_and_dtypes:
            numel = 1
            for d in shape:
                numel *= d
            sizes.append((numel, -(-numel * dtype.itemsize // 1024) * 1024))
        total = sum(size for _, size in sizes)
        if total > self.buffer.numel():
            self.buffer = torch.empty(total, dtype=torch.uint8, device=self.device)
        views, offset = [], 0
        for (shape, dtype), (numel, size) in zip(shapes_and_dtypes, sizes, strict=True):
            views.append(self.buffer[offset : offset + size].view(dtype)[:numel].view(shape))
            offset += size
        return views


def forward_context(batch: Batch, prefix: str) -> SimpleNamespace:
    """What vLLM's ``get_forward_context()`` holds during this batch's forward."""
    return SimpleNamespace(
        attn_metadata={prefix: batch.metadata},
        cudagraph_runtime_mode="NONE",
        batch_descriptor=None,
    )


def check_selection(reference: Any, batch: Batch, output: torch.Tensor, topk: int) -> None:
    """Asserts every row run of ``output`` matches the reference (tie-aware).

    Raises
    ------
    AssertionError
        Naming the row and the positions that differ beyond near-ties.
    """
    cache = batch.cache.cpu().view(batch.cache.shape[0], -1)
    for rows in batch.rows:
        q = batch.q_fp8[rows.tokens].cpu()
        w = batch.weights[rows.tokens].cpu()
        table, lengths = rows.page_table.cpu(), rows.lengths.cpu()
        logits = reference.paged_logits(q, w, cache, table, lengths, None)
        candidates = reference.candidate_mask(table, lengths, None)
        try:
            reference.assert_topk_equivalent(
                output[rows.tokens].cpu(), None, logits, candidates, topk
            )
        except AssertionError as e:
            raise AssertionError(f"{rows.kind} rows {rows.tokens.start}..: {e}") from e
