"""The sparse indexer adapter for vLLM: DeepSeek V4 C4 layers, DeepSeek V3.2 / GLM DSA.

It only translates vLLM's indexer metadata into :mod:`b12x.attention.dsa_indexer`
calls:

* **Plans** come from ``plan(Caps(...))`` with exactly ``device, num_q_heads,
  max_q_rows, max_page_table_width, topk, mode``. The library interns plans in
  its Rust plan cache and buckets the capacities, so the adapter keeps no plan
  dict of its own and equal geometries share one plan.
* **Workspace**: every call takes fresh views of vLLM's shared workspace
  (``get_simultaneous(*plan.shapes_and_dtypes())``) and binds them; nothing from
  a previous call is reused, so another op may use the workspace in between.
* **Prefill**: a one-request chunk runs against that request's page-table row
  shared by all its query rows (a stride-0 ``expand``, the ``"packed_contiguous"``
  route); a chunk of several requests (vLLM's own chunker packs them) gives
  every row its request's page-table row and runs as decode rows. Prefill rows
  that no chunk covers (a request without a K row yet) get ``-1``.
* **Decode**: one page-table row per token. vLLM's flattened rows pass through
  as they are; native multi-token rows (``seq_lens [B, next_n]``), including
  padded ones (``requires_padding``), are mapped to their tokens on the device:
  token ``t`` of request ``b`` sees ``seq_lens[b, t]`` rows of ``block_table[b]``.
* **active_width** is ``clamp(amax(lengths), 0, width * 64)`` computed on the
  device into a persistent buffer: no host sync, graph-capture safe.
* **Outputs** are never pre-filled: ``run`` writes every slot.

Bad input raises b12x's error classes (``ShapeError`` etc., all ``ValueError``
or ``TypeError``) where the reference adapter raised ``RuntimeError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from b12x import _core
from b12x.attention.dsa_indexer import INDEX_HEAD_DIM as HEAD_DIM
from b12x.attention.dsa_indexer import PAGED_INDEX_PAGE_SIZE as PAGE_SIZE
from b12x.errors import (
    ConfigError,
    DeviceError,
    DTypeError,
    LayoutError,
    NotATensorError,
    ShapeError,
)
from b12x.integration.vllm import _hooks, speed_rule

__all__ = [
    "COMPRESS_RATIOS",
    "PREFILL_ROUTE",
    "C4SparseIndexer",
    "DeepseekV4B12xSparseIndexer",
    "b12x_indexer_is_supported",
    "flatten_index_cache",
    "require_indexer_module",
]

# b12x-core's facts: vLLM allocates [blocks, 64, 132] uint8 (planar FP8 rows
# then fp32 scales) and b12x's prefill plans report this route name
_ROW_BYTES = _core.INDEXER_ROW_BYTES
PAGE_BYTES = _core.INDEXER_PAGE_BYTES
PREFILL_ROUTE = _core.INDEXER_PREFILL_ROUTE
#: K rows per token: 1 for DeepSeek V3.2 / GLM DSA, 4 for DeepSeek V4 C4 layers.
COMPRESS_RATIOS = (1, 4)
_MODULE_NAMES = ("Caps", "plan", "bind", "run", "is_supported", "PAGED_INDEX_PAGE_SIZE")


def _dsa_indexer() -> Any:
    """The library module (tests swap in a stand-in here)."""
    from b12x.attention import dsa_indexer

    return dsa_indexer


def require_indexer_module() -> Any:
    """``b12x.attention.dsa_indexer``, checked for the names this adapter calls.

    Raises
    ------
    b12x.errors.ConfigError
        If the module is missing, lacks a name, or its page size is not 64.
    """
    try:
        module = _dsa_indexer()
    except ImportError as e:
        raise ConfigError(
            f"C4SparseIndexer: b12x.attention.dsa_indexer expected importable, got {e}"
        ) from e
    missing = [name for name in _MODULE_NAMES if not hasattr(module, name)]
    if missing:
        raise ConfigError(
            f"C4SparseIndexer: b12x.attention.dsa_indexer expected {', '.join(_MODULE_NAMES)}, "
            f"got no {', '.join(missing)}"
        )
    if int(module.PAGED_INDEX_PAGE_SIZE) != PAGE_SIZE:
        raise ConfigError(
            f"C4SparseIndexer: PAGED_INDEX_PAGE_SIZE expected {PAGE_SIZE}, "
            f"got {module.PAGED_INDEX_PAGE_SIZE}"
        )
    return module


def b12x_indexer_is_supported() -> bool:
    """True when CUDA is available and the indexer kernels run on this device."""
    if not torch.cuda.is_available():
        return False
    try:
        module = require_indexer_module()
    except ConfigError:
        return False
    return bool(module.is_supported())


def flatten_index_cache(kv_cache: torch.Tensor) -> torch.Tensor:
    """vLLM's ``[blocks, 64, 132]`` uint8 index cache as ``[blocks, 8448]``, zero-copy.

    The page stride is kept (packed multi-group allocations pad it); a cache
    that is already ``[blocks, 8448]`` passes through.
    """
    op = "C4SparseIndexer"
    if kv_cache.dtype != torch.uint8:
        raise DTypeError(f"{op}: kv_cache expected uint8, got {kv_cache.dtype}")
    if kv_cache.ndim == 2 and kv_cache.shape[1] == PAGE_BYTES:
        return kv_cache
    if kv_cache.ndim != 3 or tuple(kv_cache.shape[1:]) != (PAGE_SIZE, _ROW_BYTES):
        raise ShapeError(
            f"{op}: kv_cache expected shape [blocks, {PAGE_SIZE}, {_ROW_BYTES}] "
            f"or [blocks, {PAGE_BYTES}], got {list(kv_cache.shape)}"
        )
    if kv_cache.stride(1) != _ROW_BYTES or kv_cache.stride(2) != 1:
        raise LayoutError(
            f"{op}: kv_cache expected page payloads with strides (*, {_ROW_BYTES}, 1), "
            f"got {tuple(kv_cache.stride())}"
        )
    return kv_cache.as_strided((kv_cache.shape[0], PAGE_BYTES), (kv_cache.stride(0), 1))


def _route_of(obj: Any) -> Any:
    """The route on ``obj``, its ``.layout`` or its ``.plan.layout`` (the reference's lookup)."""
    for holder in (obj, getattr(obj, "layout", None)):
        route = getattr(holder, "route", None)
        if route is not None:
            return route
    return getattr(getattr(getattr(obj, "plan", None), "layout", None), "route", None)


def _check_prefill_route(plan: Any) -> None:
    route = _route_of(plan)
    if route != PREFILL_ROUTE:
        raise ConfigError(
            f"C4SparseIndexer: prefill plan route expected {PREFILL_ROUTE!r}, got {route!r}"
        )


class C4SparseIndexer(torch.nn.Module):
    """Top-k selection of index K rows for DeepSeek sparse-attention layers.

    Drop-in for vLLM's ``B12xC4SparseIndexer`` (alias
    :data:`DeepseekV4B12xSparseIndexer`): the same constructor, ``forward``,
    ``run_paged_topk`` and profile reservation. Also serves DeepSeek V3.2 and
    GLM DSA layers (``compress_ratio=1``: one K row per token).

    Parameters
    ----------
    k_cache
        The layer's cache holder: ``.prefix`` names its metadata entry and
        ``.kv_cache`` is the ``[blocks, 64, 132]`` uint8 index cache.
    topk_tokens
        Rows selected per query (512, 1024 or 2048).
    head_dim
        Must be 128.
    max_model_len
        Maximum context in K rows (model tokens / ``compress_ratio``).
    topk_indices_buffer
        int32 ``[max_tokens, topk]`` output buffer, written in place.
    skip_k_cache_insert
        Must be True: the model writes the index K cache itself.
    use_fp4_cache
        Must be False (FP8 index cache only).
    compress_ratio
        4 (DeepSeek V4 C4 layers) or 1 (DeepSeek V3.2, GLM DSA).
    quant_block_size, scale_fmt, max_total_seq_len
        Accepted for signature compatibility; unused.
    workspace_manager, forward_context
        For callers outside vLLM: callables returning the workspace manager
        (``get_simultaneous``) and the forward context. Default: vLLM's.

    Raises
    ------
    b12x.errors.ConfigError
        On any unsupported setting, or when the kernels are not supported on
        the buffer's CUDA device.
    """

    #: What DeepSeek V3.2's attention passes on as ``topk_backend``; b12x picks its own.
    topk_backend = "auto"

    def __init__(
        self,
        k_cache: Any,
        quant_block_size: int,
        scale_fmt: str,
        topk_tokens: int,
        head_dim: int,
        max_model_len: int,
        max_total_seq_len: int,
        topk_indices_buffer: torch.Tensor | None,
        skip_k_cache_insert: bool = False,
        use_fp4_cache: bool = False,
        compress_ratio: int = 1,
        *,
        workspace_manager: Callable[[], Any] | None = None,
        forward_context: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__()
        del quant_block_size, scale_fmt, max_total_seq_len
        op = "C4SparseIndexer"
        if not skip_k_cache_insert:
            raise ConfigError(
                f"{op}: skip_k_cache_insert expected True (the model writes the index K cache), "
                "got False"
            )
        if use_fp4_cache:
            raise ConfigError(f"{op}: use_fp4_cache expected False (FP8 index cache), got True")
        if compress_ratio not in COMPRESS_RATIOS:
            raise ConfigError(
                f"{op}: compress_ratio expected one of {COMPRESS_RATIOS}, got {compress_ratio}"
            )
        if head_dim != HEAD_DIM:
            raise ConfigError(f"{op}: head_dim expected {HEAD_DIM}, got {head_dim}")
        if topk_indices_buffer is None:
            raise ConfigError(f"{op}: topk_indices_buffer expected an int32 tensor, got None")
        module = require_indexer_module()
        if topk_indices_buffer.is_cuda and not module.is_supported(topk_indices_buffer.device):
            raise ConfigError(
                f"{op}: device expected one the indexer kernels support, "
                f"got {topk_indices_buffer.device} (dsa_indexer.is_supported() is False)"
            )
        self._module = module
        self._workspace_manager = workspace_manager
        self._forward_context = forward_context
        self.k_cache = k_cache
        self.topk_tokens = int(topk_tokens)
        self.max_model_len = int(max_model_len)
        self.compress_ratio = int(compress_ratio)
        self.topk_indices_buffer = topk_indices_buffer
        # amax(lengths) lands here on the device; persistent so graphs capture its address.
        self.register_buffer(
            "_active_width",
            torch.zeros((1,), dtype=torch.int32, device=topk_indices_buffer.device),
            persistent=False,
        )

    def _workspace(self) -> Any:
        return (self._workspace_manager or _hooks.workspace_manager)()

    # --- planning -----------------------------------------------------------------

    def _plan(self, device: torch.device, heads: int, rows: int, width: int, mode: str) -> Any:
        module = self._module
        plan = module.plan(
            module.Caps(
                device=device,
                num_q_heads=heads,
                max_q_rows=max(rows, 1),
                max_page_table_width=max(width, 1),
                topk=self.topk_tokens,
                mode=mode,
                precision=speed_rule.PLAN_PRECISION,  # what the rule compares
            )
        )
        if mode == "prefill":
            _check_prefill_route(plan)
        return plan

    def reserve_profile_workspace(self, q: torch.Tensor) -> None:
        """Grows the shared workspace to the worst case before vLLM locks it.

        Plans decode and prefill for ``q``'s rows at ``max_model_len`` and asks
        the workspace manager for both once; computes nothing. No plan with
        fewer rows or a narrower table needs more scratch, so every later call
        (prefill chunks, decode rows, several-request chunks run as decode
        rows) fits the locked workspace.
        """
        rows = int(q.shape[0])
        width = -(-self.max_model_len // PAGE_SIZE)
        manager = self._workspace()
        for mode in ("decode", "prefill"):
            plan = self._plan(q.device, int(q.shape[1]), rows, width, mode)
            manager.get_simultaneous(*plan.shapes_and_dtypes())

    _reserve_profile_workspace = reserve_profile_workspace  # the reference adapter's name

    # --- one selection --------------------------------------------------------------

    def _device_active_width(self, cache_lengths: Any, width: int) -> torch.Tensor:
        # Checked here because amax(out=int32) would raise torch's own error first.
        op = "C4SparseIndexer"
        buf = cast(torch.Tensor, self._active_width)  # a registered buffer
        if not isinstance(cache_lengths, torch.Tensor):
            raise NotATensorError(
                f"{op}: cache_lengths expected an int32 tensor, got {type(cache_lengths).__name__}"
            )
        if cache_lengths.dtype != torch.int32:
            raise DTypeError(f"{op}: cache_lengths expected dtype int32, got {cache_lengths.dtype}")
        if cache_lengths.ndim != 1:
            raise ShapeError(
                f"{op}: cache_lengths expected shape (rows,), got {tuple(cache_lengths.shape)}"
            )
        if cache_lengths.device != buf.device:
            raise DeviceError(
                f"{op}: cache_lengths expected device {buf.device}, got {cache_lengths.device}"
            )
        torch.amax(cache_lengths, dim=0, keepdim=True, out=buf)
        return buf.clamp_(0, width * PAGE_SIZE)

    def _select(
        self,
        q: torch.Tensor,
        weights: torch.Tensor,
        kv_cache: torch.Tensor,
        cache_lengths: torch.Tensor,
        page_table: torch.Tensor,
        active_width: torch.Tensor | None,
        output: torch.Tensor,
        scores: torch.Tensor | None,
        shared_page_table: bool,
    ) -> None:
        rows = int(q.shape[0])
        if rows == 0:
            return  # nothing to select (static shape: no device value is read)
        width = int(page_table.shape[1])
        mode = "prefill" if shared_page_table else "decode"
        plan = self._plan(q.device, int(q.shape[1]), rows, width, mode)
        scratch = self._workspace().get_simultaneous(*plan.shapes_and_dtypes())
        if active_width is None:
            active_width = self._device_active_width(cache_lengths, width)
        module = self._module
        binding = module.bind(
            plan,
            scratch=scratch,
            q_fp8=q,
            query_weights=weights,
            index_k_cache=flatten_index_cache(kv_cache),
            page_table=page_table,
            cache_lengths=cache_lengths,
            active_width=active_width,
            output_indices=output,
            output_scores=scores,
        )
        module.run(binding)

    def run_paged_topk(
        self,
        *,
        q: torch.Tensor,
        weights: torch.Tensor,
        kv_cache: torch.Tensor,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        output: torch.Tensor,
        scores: torch.Tensor | None = None,
        shared_page_table: bool,
        active_width: torch.Tensor | None = None,
        schedule_metadata: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Selects top-k for caller-owned paged metadata; returns ``output``.

        Parameters
        ----------
        q
            float8_e4m3fn ``[rows, heads, 128]``.
        weights
            float32 ``[rows, heads]`` or ``[rows, heads, 1]``.
        kv_cache
            uint8 ``[blocks, 64, 132]`` (or ``[blocks, 8448]``).
        seq_lens
            int32 ``[rows]``: visible K rows per query row.
        block_table
            int32 ``[rows, width]`` page ids. With ``shared_page_table`` (one
            request, prefill) every row reads the first row's pages: a
            stride-0 ``[1, width].expand(rows, width)`` view is used as is, any
            other table through such a view of its first row.
        output, scores
            int32 / float32 ``[rows, topk]``; written by the library, never here.
        active_width
            int32 ``[1]`` device bound on the lengths; computed on the device
            when None.
        schedule_metadata
            Accepted and ignored: DeepGEMM's per-SM schedule, which callers
            built for its kernels; b12x's grids come from the plan.

        Raises
        ------
        b12x.errors.ShapeError, b12x.errors.DTypeError
            If ``output`` or ``scores`` do not have shape ``[rows, topk]``
            (scores: float32), or ``seq_lens`` is not int32 ``[rows]``. The
            library's ``bind`` checks everything else.
        """
        del schedule_metadata
        op = "C4SparseIndexer.run_paged_topk"
        rows = int(q.shape[0])
        expected = (rows, self.topk_tokens)
        if tuple(output.shape) != expected:
            raise ShapeError(f"{op}: output expected shape {expected}, got {tuple(output.shape)}")
        if scores is not None:
            if tuple(scores.shape) != expected:
                raise ShapeError(
                    f"{op}: scores expected shape {expected}, got {tuple(scores.shape)}"
                )
            if scores.dtype != torch.float32:
                raise DTypeError(f"{op}: scores expected float32, got {scores.dtype}")
        if shared_page_table and block_table.ndim == 2 and block_table.stride(0) != 0:
            block_table = block_table[:1].expand(rows, block_table.shape[1])
        self._select(
            q,
            weights,
            kv_cache,
            seq_lens,
            block_table,
            active_width,
            output,
            scores,
            shared_page_table,
        )
        return output

    # --- vLLM forward -----------------------------------------------------------------

    def forward(
        self,
        hidden_states: torch.Tensor,
        q_quant: Any,
        k: torch.Tensor | None,
        weights: torch.Tensor,
    ) -> torch.Tensor:
        """Fills ``topk_indices_buffer`` for the current batch and returns it.

        Reads vLLM's forward context: no per-layer metadata (a profile run)
        reserves the workspace; prefill chunks run first, then the decode rows.
        """
        del hidden_states
        op = "C4SparseIndexer.forward"
        if not isinstance(q_quant, torch.Tensor):
            raise DTypeError(f"{op}: q_quant expected an FP8 tensor, got {type(q_quant).__name__}")
        if k is not None:
            raise ConfigError(
                f"{op}: k expected None (the model writes the index K cache first), got a tensor"
            )
        context = (self._forward_context or _hooks.forward_context)()
        attn_metadata = context.attn_metadata
        if not isinstance(attn_metadata, dict):
            if (
                _hooks.is_eager_mode(context.cudagraph_runtime_mode)
                and getattr(context, "batch_descriptor", None) is not None
            ):
                self.reserve_profile_workspace(q_quant)
            return self.topk_indices_buffer
        metadata = attn_metadata[self.k_cache.prefix]
        if metadata.prefill is not None:
            for chunk in metadata.prefill.chunks:
                self._prefill_chunk(chunk, q_quant, weights)
            self._clear_uncovered_prefill_rows(metadata)
        if metadata.decode is not None:
            self._decode(metadata, q_quant, weights)
        return self.topk_indices_buffer

    def _output_rows(self, start: int, end: int) -> torch.Tensor:
        return self.topk_indices_buffer[start:end, : self.topk_tokens]

    def _prefill_chunk(self, chunk: Any, q: torch.Tensor, weights: torch.Tensor) -> None:
        start, end = int(chunk.token_start), int(chunk.token_end)
        rows = end - start
        if rows <= 0:
            return
        lengths = chunk.cu_seqlen_ke - chunk.cu_seqlen_ks
        if lengths.dtype != torch.int32:
            lengths = lengths.to(torch.int32)
        table = chunk.block_table
        width = int(table.shape[1])
        # Only the pages the longest request has filled; at least one so the plan is non-empty.
        longest = int(getattr(chunk, "max_seqlen_k", chunk.total_seq_lens))
        active_pages = min(max(1, -(-longest // PAGE_SIZE)), width)
        if int(chunk.num_reqs) == 1:
            page_table = table[:1, :active_pages].expand(rows, active_pages)
            shared = True
        else:
            page_table = _rows_of_owners(chunk, table[:, :active_pages])
            shared = False
        self._select(
            q[start:end].contiguous(),
            weights[start:end].contiguous(),
            self.k_cache.kv_cache,
            lengths,
            page_table,
            None,
            self._output_rows(start, end),
            None,
            shared,
        )

    def _clear_uncovered_prefill_rows(self, metadata: Any) -> None:
        """``-1`` for prefill rows no chunk covers (vLLM drops a chunk without K rows)."""
        first = getattr(metadata, "num_decode_tokens", None)
        count = getattr(metadata, "num_prefill_tokens", None)
        if first is None or count is None:
            return
        cursor, end = int(first), int(first) + int(count)
        for chunk in sorted(metadata.prefill.chunks, key=lambda c: int(c.token_start)):
            if int(chunk.token_start) > cursor:
                self._output_rows(cursor, int(chunk.token_start)).fill_(-1)
            cursor = max(cursor, int(chunk.token_end))
        if end > cursor:
            self._output_rows(cursor, end).fill_(-1)

    def _decode(self, metadata: Any, q: torch.Tensor, weights: torch.Tensor) -> None:
        n = int(metadata.num_decode_tokens)
        if n == 0:
            return
        decode = metadata.decode
        lengths, table = _decode_rows(decode, n)
        self._select(
            q[:n].contiguous(),
            weights[:n].contiguous(),
            self.k_cache.kv_cache,
            lengths,
            table,
            getattr(decode, "active_width", None),
            self._output_rows(0, n),
            None,
            False,
        )


def _rows_of_owners(chunk: Any, table: torch.Tensor) -> torch.Tensor:
    """Each query row's own page-table row, for a chunk of several requests.

    Row ``r`` starts at ``cu_seqlen_ks[r]`` in the chunk's packed K, which is
    its request's ``cu_seq_lens`` entry; found on the device (no sync). A row
    of an empty request may land on a neighbour's row: it reads nothing.
    """
    starts = chunk.cu_seq_lens[1:].to(torch.int64)
    owner = torch.searchsorted(starts, chunk.cu_seqlen_ks.to(torch.int64), right=True)
    owner.clamp_(max=int(table.shape[0]) - 1)
    return table.index_select(0, owner)


def _decode_rows(decode: Any, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lengths [tokens], page_table [tokens, width])``, one row per decode token.

    vLLM gives either flattened rows (``seq_lens`` ``[tokens]`` or
    ``[tokens, 1]`` with one table row each: passed through) or native
    multi-token rows (``seq_lens [B, n]``, ``block_table [B, width]``,
    ``decode_lens [B]`` tokens per request, padded when they differ): token
    ``t`` of request ``b`` then sees ``seq_lens[b, t]``, as in vLLM's own path
    (pack, score, unpack); tokens past ``sum(decode_lens)`` see none.
    """
    op = "C4SparseIndexer.forward"
    seq_lens, table = decode.seq_lens, decode.block_table
    per_token = seq_lens.ndim == 1 or (seq_lens.ndim == 2 and seq_lens.shape[1] == 1)
    # One row per token: flattened rows or single-token requests. A padded
    # batch with more requests than tokens takes the mapping below.
    exact = seq_lens.shape[0] == tokens or not getattr(decode, "requires_padding", False)
    if per_token and exact and min(seq_lens.shape[0], table.shape[0]) >= tokens:
        return seq_lens.reshape(-1)[:tokens], table[:tokens].contiguous()
    grid = seq_lens if seq_lens.ndim == 2 else seq_lens.reshape(-1, 1)
    requests, depth = int(grid.shape[0]), int(grid.shape[1])
    if requests != int(table.shape[0]) or requests == 0:
        raise ShapeError(
            f"{op}: decode.seq_lens expected one row per decode token ({tokens}) or per "
            f"block_table row ({int(table.shape[0])}), got shape {tuple(seq_lens.shape)}"
        )
    token = torch.arange(tokens, device=grid.device)
    decode_lens = getattr(decode, "decode_lens", None)
    if decode_lens is None or int(decode_lens.shape[0]) != requests:
        if requests * depth != tokens:
            raise ShapeError(
                f"{op}: decode.seq_lens expected {tokens} tokens ({requests} requests x "
                f"{depth}), got shape {tuple(seq_lens.shape)}"
            )
        decode_lens = torch.full((requests,), depth, dtype=torch.int64, device=grid.device)
    ends = torch.cumsum(decode_lens.to(torch.int64), dim=0)
    owner = torch.searchsorted(ends, token, right=True).clamp_(max=requests - 1)
    position = token - (ends - decode_lens.to(torch.int64))[owner]
    live = (token < ends[-1]) & (position < depth)
    lengths = grid[owner, position.clamp_(0, depth - 1)]
    lengths = torch.where(live, lengths, torch.zeros_like(lengths)).to(torch.int32)
    return lengths, table.index_select(0, owner)


# DeepSeek V4 model code imports this name; GLM imports the shared one.
DeepseekV4B12xSparseIndexer = C4SparseIndexer
