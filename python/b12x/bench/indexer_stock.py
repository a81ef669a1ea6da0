"""The stock vLLM 0.33 indexer calls on Hopper, timed as arms of ``b12x bench indexer``.

Each call is made as vLLM 0.33 makes it (``model_executor/layers/sparse_attn_indexer.py``,
``utils/deep_gemm.py``, ``v1/attention/backends/mla/indexer.py``, ``layers/indexer_topk.py``):

* decode: ``get_paged_mqa_logits_metadata(context_lens [B, 1], 64, SMs)`` once
  per step (vLLM's metadata builder: every layer shares it), then per layer
  ``fp8_fp4_paged_mqa_logits((q [B, 1, H, 128], None), cache [pages, 64, 1, 132],
  weights [B, H], context_lens, block_table, schedule, max_model_len)`` and the
  top-k kernel vLLM's ``auto`` backend picks;
* prefill, one request per chunk: ``cp_gather_indexer_k_quant_cache`` copies
  the request's K rows and scales out of the paged cache, then
  ``fp8_fp4_mqa_logits((q, None), (k, k_scale), weights, ks, ke, max_seqlen_k)``
  and ``top_k_per_row_prefill`` over ``[0, ke - ks)``.

Arms per case: ``deepgemm_logits``, ``deepgemm_metadata`` (decode), ``kgather``
(prefill: vLLM's compiled gather where it imports, else the same copy in
PyTorch, named in ``kgather_impl``) and ``stock_vllm``, the whole stock call:
(gather +) logits + vLLM's top-k in one graph where vLLM's compiled top-k
imports (``topk_source`` "live: ..."; ``topk_only:vllm`` and
``topk_only:vllm_persistent`` then time it alone), else the measured (gather
+) logits plus the stored top-k figure (``topk_source`` "stored: ...").
``stock_vllm`` leaves out the metadata call: vLLM makes it once per step.

Every arm takes its timer (``measure``) and its modules as arguments, so the
CPU tests drive the calls with fakes.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from b12x._core import INDEXER_PAGE_SIZE as PAGE
from b12x.bench.common import BenchResult
from b12x.bench.indexer_peers import (
    LOGITS_REL_TOL,
    STORED_TOPK_TIMING,
    TOPK_WORKSPACE_BYTES,
    Measure,
    PeerEnv,
    attach_ratios,
    check_rows,
    check_selection,
    fail_check,
    logits_rel_err,
    reference_logits,
    vllm_topk_kernel,
)

if TYPE_CHECKING:
    import torch

    from b12x.bench.indexer import Case

SCALE_BYTES = 4
ROW_BYTES = 128 + SCALE_BYTES  # vLLM's index cache is [pages, 64, 132] uint8
# the top-k kernels this bench can call live (vllm_topk_step)
LIVE_TOPK_KERNELS = ("cooperative_topk", "persistent_topk", "top_k_per_row_prefill")


class DecodeCall:
    """vLLM's decode call for one bench case: ``B = rows`` requests of one token."""

    def __init__(self, dg: Any, case: Case, inputs: tuple[torch.Tensor, ...], sms: int) -> None:
        q, w, kcache, table, lengths, _aw = inputs
        self.dg = dg
        self.sms = sms
        self.max_model_len = case.context
        self.q = q.view(case.rows, 1, case.heads, 128)  # next_n = 1
        # vLLM's [pages, 64, 132] cache, then kv_cache_as_quant_view's unsqueeze
        self.kv_cache = kcache.view(kcache.shape[0], PAGE, ROW_BYTES).unsqueeze(-2)
        self.weights = w
        self.context_lens = lengths.view(case.rows, 1)  # DeepGEMM wants [B, next_n]
        self.block_table = table
        self.schedule = self.metadata()

    def metadata(self) -> torch.Tensor:
        # vLLM passes SMs // 2 only for next_n == 4 on sm_90 (2-CTA clusters)
        schedule: torch.Tensor = self.dg.get_paged_mqa_logits_metadata(
            self.context_lens, PAGE, self.sms
        )
        return schedule

    def logits(self) -> torch.Tensor:
        logits: torch.Tensor = self.dg.fp8_fp4_paged_mqa_logits(
            (self.q, None),
            self.kv_cache,
            self.weights,
            self.context_lens,
            self.block_table,
            self.schedule,
            self.max_model_len,
        )
        return logits


class PrefillCall:
    """vLLM's prefill chunk of one request: gather its K, then the ragged logits."""

    def __init__(
        self,
        dg: Any,
        case: Case,
        inputs: tuple[torch.Tensor, ...],
        vllm_gather: Callable[..., Any] | None,
    ) -> None:
        import torch

        q, w, kcache, table, lengths, _aw = inputs
        dev = q.device
        tokens = case.context  # the request's K rows: the whole table
        if tokens % PAGE:
            raise ValueError(f"kgather: context expected a multiple of {PAGE}, got {tokens}")
        self.dg = dg
        self.q, self.weights = q, w
        self.max_seqlen_k = case.context
        self.kv_cache = kcache.view(kcache.shape[0], PAGE, ROW_BYTES)
        self.flat_cache = kcache
        self.pages = table[0, : -(-tokens // PAGE)].long()
        self.block_table = table[:1].contiguous()  # the chunk's one request
        self.cu_seq_lens = torch.tensor([0, tokens], dtype=torch.int32, device=dev)
        # vLLM's gather workspace: K values [T, 128] fp8, scales [T, 4] bytes
        self.k = torch.empty((tokens, 128), dtype=torch.float8_e4m3fn, device=dev)
        self.k_scale = torch.empty((tokens, SCALE_BYTES), dtype=torch.uint8, device=dev)
        self.ks = torch.zeros((case.rows,), dtype=torch.int32, device=dev)
        self.ke = lengths  # one request: row i sees K rows [0, lengths[i])
        self.row_ends = self.ke - self.ks
        self._vllm_gather = vllm_gather
        self.gather_impl = (
            "vLLM cp_gather_indexer_k_quant_cache"
            if vllm_gather is not None
            else "torch index_select + copy (vLLM's compiled gather not importable)"
        )

    def gather(self) -> None:
        if self._vllm_gather is not None:
            self._vllm_gather(
                self.kv_cache, self.k, self.k_scale, self.block_table, self.cu_seq_lens
            )
            return
        # the same bytes moved with PyTorch: each page's 64 K rows, then its 64 scales
        pages = self.flat_cache.index_select(0, self.pages)
        n = pages.shape[0]
        self.k.view(pages.dtype).view(n, PAGE * 128).copy_(pages[:, : PAGE * 128])
        self.k_scale.view(n, PAGE * SCALE_BYTES).copy_(pages[:, PAGE * 128 :])

    def logits(self) -> torch.Tensor:
        import torch

        scales = self.k_scale.view(torch.float32).squeeze(-1)  # [T] fp32 off SM100
        logits: torch.Tensor = self.dg.fp8_fp4_mqa_logits(
            (self.q, None),
            (self.k, scales),
            self.weights,
            self.ks,
            self.ke,
            self.max_seqlen_k,
        )
        return logits


def vllm_topk_step(
    ops: Mapping[str, Any],
    kernel: str,
    *,
    seq_lens: torch.Tensor,
    row_ends: torch.Tensor,
    out: torch.Tensor,
    workspace: torch.Tensor,
    topk: int,
    max_seq_len: int,
) -> Callable[[torch.Tensor], None]:
    """vLLM's call of its top-k ``kernel`` on a logits tensor, as a one-argument step."""
    import torch

    if kernel == "top_k_per_row_prefill":
        op = ops[kernel]
        starts = torch.zeros_like(row_ends)  # DeepGEMM's ragged logits start at column 0

        def prefill(logits: torch.Tensor) -> None:
            op(logits, starts, row_ends, out, logits.shape[0], logits.stride(0), logits.stride(1),
               topk)  # fmt: skip

        return prefill
    if kernel in ("cooperative_topk", "persistent_topk"):
        op = ops[kernel]

        def decode(logits: torch.Tensor) -> None:
            op(logits, seq_lens, out, workspace, topk, max_seq_len)

        return decode
    raise ValueError(f"vllm_topk_step: kernel expected one of {LIVE_TOPK_KERNELS}, got {kernel!r}")


# --- the arms ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaseArms:
    """One case's peer arms: where the rows go, the case and its inputs
    (:func:`b12x.bench.indexer.make_inputs`), the peers, the timer and the keys
    every row carries (the case's floors)."""

    result: BenchResult
    case: Case
    inputs: tuple[torch.Tensor, ...]
    env: PeerEnv
    measure: Measure
    extra: dict[str, Any]

    def add(self, arm: str, samples: list[float], **fields: Any) -> dict[str, Any]:
        return self.result.add(self.case.name, arm, samples, **self.extra, **fields)

    def fail(self, what: str) -> None:
        """A peer check failed: the run exits 1 and its notes say which."""
        fail_check(self.result, self.case.name, what)


@dataclass(frozen=True)
class Pipeline:
    """What vLLM runs before its top-k for the case, and its logits once."""

    step: Callable[[], torch.Tensor]  # (gather +) logits
    logits: torch.Tensor
    samples: list[float] | None  # already timed (decode: the logits arm), or None
    seq_lens: torch.Tensor  # what vLLM's top-k takes: [B, 1] lengths / prefill row ends
    fields: dict[str, Any]  # what the stock row says about it


def peer_arms(
    result: BenchResult,
    case: Case,
    inputs: tuple[torch.Tensor, ...],
    env: PeerEnv,
    measure: Measure,
    extra: dict[str, Any],
) -> None:
    """Declares ``case``'s DeepGEMM and ``stock_vllm`` arms on ``measure``
    (where DeepGEMM imports); once they are timed, their rows go to
    ``result``, then every b12x row of the case gets its ratio to them."""
    if env.deep_gemm.ok:
        arms = CaseArms(result, case, inputs, env, measure, extra)
        pipeline = _prefill_arms(arms) if case.prefill else _decode_arms(arms)
        _stock_arm(arms, pipeline)
    measure.then(partial(attach_ratios, result.results, case.name))


def _decode_arms(a: CaseArms) -> Pipeline:
    call = DecodeCall(a.env.deep_gemm.module, a.case, a.inputs, a.env.sms)
    samples = a.measure(call.logits)
    logits = call.logits()
    check = LogitsCheck(a, logits)
    metadata = a.measure(call.metadata)

    def finish() -> None:
        row = a.add("deepgemm_logits", samples, max_model_len=a.case.context)
        check.after_timing(row, call.logits)
        a.add("deepgemm_metadata", metadata)

    a.measure.then(finish)
    excludes = "deepgemm_metadata (vLLM builds it once per step, for every layer)"
    return Pipeline(call.logits, logits, samples, call.context_lens, {"excludes": excludes})


def _prefill_arms(a: CaseArms) -> Pipeline:
    ops = a.env.vllm_ops.module if a.env.vllm_ops.ok else None
    gather = ops["cp_gather_indexer_k_quant_cache"] if ops is not None else None
    call = PrefillCall(a.env.deep_gemm.module, a.case, a.inputs, gather)
    gathered = a.measure(call.gather)
    call.gather()
    samples = a.measure(call.logits)
    logits = call.logits()
    check = LogitsCheck(a, logits)

    def finish() -> None:
        a.add("kgather", gathered, kgather_impl=call.gather_impl)
        row = a.add("deepgemm_logits", samples, max_seqlen_k=call.max_seqlen_k)
        check.after_timing(row, call.logits)

    a.measure.then(finish)

    def gather_then_logits() -> torch.Tensor:
        call.gather()
        return call.logits()

    fields = {"kgather_impl": call.gather_impl}
    return Pipeline(gather_then_logits, logits, None, call.row_ends, fields)


class LogitsCheck:
    """DeepGEMM's logits against the float32 reference on spread rows, three
    ways: ``held``, when it is made (at the arm's declaration); the same
    tensor after the timing; and one more call after it. A wrong call fails
    the first and the last; a write into the held logits while the case's
    arms ran fails only the second."""

    def __init__(self, a: CaseArms, held: torch.Tensor) -> None:
        import torch

        self.a, self.held = a, held
        self.rows = check_rows(a.case.rows)
        self.ref, self.lengths = reference_logits(a.inputs, self.rows)
        self.sel = torch.tensor(self.rows, device=held.device)
        self.made_err = self.err(held)

    def err(self, logits: torch.Tensor) -> float:
        return logits_rel_err(logits.index_select(0, self.sel), self.ref, self.lengths)

    def after_timing(self, row: dict[str, Any], again: Callable[[], torch.Tensor]) -> None:
        """The last two checks, into the arm's ``row``; a failure fails the run."""
        made, err, held = self.made_err, self.err(again()), self.err(self.held)
        row.update(
            logits_max_rel_err=err,
            logits_made_rel_err=made,
            held_logits_max_rel_err=held,
            logits_rel_tol=LOGITS_REL_TOL,
            check_rows=len(self.rows),
            check_ok=max(made, err, held) <= LOGITS_REL_TOL,
        )
        if max(made, err) > LOGITS_REL_TOL:
            self.a.fail(
                f"deepgemm_logits relative error expected <= {LOGITS_REL_TOL:g}, got "
                f"{made:.3g} before the timing and {err:.3g} after it "
                "(the peer call is wrong: its times mean nothing)"
            )
        elif held > LOGITS_REL_TOL:
            self.a.fail(
                f"deepgemm_logits computed before the timing (relative error {made:.3g} "
                f"then): expected <= {LOGITS_REL_TOL:g} after it, got {held:.3g}, while a "
                f"call after the timing gives {err:.3g}: something wrote into them while the "
                "case's arms ran"
            )


def _stock_arm(a: CaseArms, pipeline: Pipeline) -> None:
    """``stock_vllm``: the pipeline plus the top-k kernel vLLM runs, live in the
    same graph where vLLM's ops import, else plus its stored figure."""
    kernel = vllm_topk_kernel(
        prefill=a.case.prefill,
        rows=a.case.rows,
        topk=a.case.topk,
        logits_row_stride=int(pipeline.logits.stride(0)),
        capability=a.env.capability,
    )
    fields: dict[str, Any] = {"topk_kernel": kernel, **pipeline.fields}
    if a.env.vllm_ops.ok and kernel in LIVE_TOPK_KERNELS:
        _live_stock(a, pipeline, kernel, fields)
        return
    figure, why = a.env.stored.lookup(a.case.name, kernel, a.env.device_name)
    if figure is None:
        a.result.notes.append(
            f"{a.case.name}: no stock_vllm row: vLLM's top-k is not live "
            f"({a.env.vllm_ops.detail}) and {why}"
        )
        return
    base = pipeline.samples if pipeline.samples is not None else a.measure(pipeline.step)

    def finish() -> None:
        measured = statistics.median(base)
        fields.update(
            topk_source=a.env.stored.label, topk_us=figure, topk_timing=STORED_TOPK_TIMING
        )
        fields["measured_part_us"] = measured
        best = a.env.stored.best(a.case.name)
        if best is not None:
            fields.update(
                topk_best_kernel=best[0], topk_best_us=best[1], stock_best_us=measured + best[1]
            )
        a.add("stock_vllm", [x + figure for x in base], **fields)

    a.measure.then(finish)


def _live_stock(a: CaseArms, pipeline: Pipeline, kernel: str, fields: dict[str, Any]) -> None:
    """vLLM's top-k timed alone (the kernel it picks, and persistent_topk for
    decode), and the whole stock call in one graph, its selection checked."""
    import torch

    dev = pipeline.logits.device
    out = torch.empty((a.case.rows, a.case.topk), dtype=torch.int32, device=dev)
    workspace = torch.empty((TOPK_WORKSPACE_BYTES,), dtype=torch.uint8, device=dev)

    def step_of(name: str) -> Callable[[torch.Tensor], None]:
        return vllm_topk_step(
            a.env.vllm_ops.module, name, seq_lens=pipeline.seq_lens, row_ends=pipeline.seq_lens,
            out=out, workspace=workspace, topk=a.case.topk, max_seq_len=a.case.context,
        )  # fmt: skip

    logits = pipeline.logits
    arms = {kernel: "topk_only:vllm"}
    if not a.case.prefill and kernel != "persistent_topk":
        arms["persistent_topk"] = "topk_only:vllm_persistent"
    alone_samples = {name: a.measure(partial(step_of(name), logits)) for name in arms}
    topk = step_of(kernel)
    samples = a.measure(lambda: topk(pipeline.step()))

    def finish() -> None:
        alone = {
            name: float(a.add(arm, alone_samples[name], topk_kernel=name)["median_us"])
            for name, arm in arms.items()
        }
        best = min(alone, key=lambda k: alone[k])
        fields.update(
            topk_source=f"live: torch.ops._C.{kernel}",
            topk_us=alone[kernel],
            topk_best_kernel=best,
            topk_best_us=alone[best],
            stock_best_us=statistics.median(samples) - alone[kernel] + alone[best],
        )
        topk(pipeline.step())  # the whole stock call once more, as it was timed
        # vLLM's selection against the float32 reference: near-ties may swap, as a
        # logit is off by at most LOGITS_REL_TOL of its row's largest (the logits check)
        check_selection(
            a.result, fields, a.case.name, "stock_vllm", out, a.inputs, a.case.topk, LOGITS_REL_TOL
        )
        a.add("stock_vllm", samples, **fields)

    a.measure.then(finish)
