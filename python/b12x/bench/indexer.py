"""C4 indexer: b12x kernels vs the PyTorch path, CUDA-graph replay, L2 flushed.

Each arm is captured once in a CUDA graph and replayed; before every replay a
buffer of twice the L2 size is rewritten (outside the timed events), so every
sample reads the K cache from HBM. A case's arms are timed interleaved (one
replay of each in turn, :mod:`b12x.bench.interleave`), so that all of them run
on the same clocks; the checks follow the timing. Arms per case: `b12x` (the default, exact
plan), `b12x_fast` (`Caps(precision="fast")`: FP8 wgmma on Hopper, the exact
flavor elsewhere), `topk_only:b12x` and `topk_only:torch` (the top-k stage
alone on the logits the `b12x` arm left in its scratch: b12x's selection
kernels, and `torch.topk`), optional `b12x_<flavor>` arms with the MMA flavor
forced, and `torch`, what a user would write:
gather the pages, a bf16 GEMM per head, relu * weight, sum over heads, times
the per-token scale, mask, `torch.topk`. The table adds the HBM floor (K
cache, Q and outputs at 4.3 TB/s) and the FP8 floor (2 * rows * heads * 128 *
live tokens at 1979 TFLOP/s, Hopper's dense FP8 wgmma peak from the datasheet).

The peer is stock vLLM 0.33's Hopper indexer (:mod:`b12x.bench.indexer_stock`):
DeepGEMM's logits (``deepgemm_logits``, ``deepgemm_metadata``, the prefill
``kgather``) and ``stock_vllm``, DeepGEMM's logits plus vLLM's top-k; each
skipped with its reason where its package does not import. Every whole-call
b12x row gets ``vs_stock`` (its median / ``stock_vllm``'s); ``score_only:b12x``
and ``score_only:b12x_fast`` (the scorers alone, a score-only plan) get
``vs_peer`` against ``deepgemm_logits``, ``topk_only:b12x`` against vLLM's top-k.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from b12x._cli_args import Unavailable, positive_int
from b12x._core import INDEXER_MMA_FLAVORS
from b12x._core import INDEXER_PAGE_BYTES as PAGE_BYTES
from b12x._core import INDEXER_PAGE_SIZE as PAGE
from b12x.bench import indexer_peers as peers
from b12x.bench import indexer_stock
from b12x.bench.common import BenchResult, l2_flusher
from b12x.bench.interleave import ArmTimer, Samples
from b12x.errors import ConfigError

if TYPE_CHECKING:
    import torch

HBM_BYTES_PER_S = 4.3e12
MMA_FLOP_PER_S = 1.979e15  # dense FP8 wgmma, H100/H200 datasheet


@dataclass(frozen=True)
class Case:
    name: str
    rows: int
    context: int  # K rows of the longest row
    prefill: bool
    heads: int = 64
    topk: int = 512

    @property
    def width(self) -> int:
        return self.context // PAGE

    def lengths(self) -> list[int]:
        if self.prefill:  # causal: L - rows + 1 .. L
            return [self.context - self.rows + 1 + i for i in range(self.rows)]
        return [self.context] * self.rows


CASES = {
    c.name: c
    for c in (
        Case("decode_r64_L32768", 64, 32768, prefill=False),
        Case("decode_r1_L131072", 1, 131072, prefill=False),
        Case("prefill_r4096_L32768", 4096, 32768, prefill=True),
        Case("decode_r16_L65536", 16, 65536, prefill=False),
    )
}
DEFAULT_CASES = ["decode_r64_L32768", "decode_r1_L131072", "prefill_r4096_L32768"]
# How a bench table row orders its page ids: the same pages either way, so
# the same bytes move; what changes is where in HBM the reads land together.
PAGE_ORDERS = ("random", "ascending")
# MMA flavors a plan can be forced to (the test-only option of _core.indexer_build_plan).
FLAVORS: tuple[str, ...] = INDEXER_MMA_FLAVORS
# how the samples were taken (the JSON's config says so)
TIMING = (
    "CUDA-graph replay, L2 flushed before each; a case's arms interleaved, one replay of each "
    "a round, the order rotated by one arm every round"
)
# what the printed table shows besides case, arm, median and min (the JSON has every key)
TABLE_COLUMNS = [
    "vs_stock",
    "vs_peer",
    "peer",
    "mma_flavor",
    "topk_overlap_min",
    "logits_max_rel_err",
    "check_ok",
    "topk_kernel",
    "topk_source",
]


class ScratchGuards:
    """Scratch for the bench's plans, each followed by a guard: ``GUARD_BYTES``
    set to ``PATTERN`` past the plan's ``nbytes``. With every arm of a case
    alive at once, a kernel writing past its scratch would land in another
    arm's buffers, where compute-sanitizer does not look (inside the caching
    allocator's segments); :meth:`check` after the timing names each plan
    whose guard changed and fails the run."""

    GUARD_BYTES = 1 << 20
    PATTERN = 0xA5

    def __init__(self, device: str = "cuda") -> None:
        self.device = device
        self.held: list[tuple[Any, torch.Tensor]] = []

    def scratch(self, plan: Any) -> torch.Tensor:
        import torch

        buf = torch.empty((plan.nbytes + self.GUARD_BYTES,), dtype=torch.uint8, device=self.device)
        buf[plan.nbytes :].fill_(self.PATTERN)
        self.held.append((plan, buf))
        return buf

    def check(self, result: BenchResult, case: str) -> None:
        for plan, buf in self.held:
            changed = int((buf[plan.nbytes :] != self.PATTERN).sum())
            if changed:
                peers.fail_check(
                    result,
                    case,
                    f"{plan!r} wrote {changed} bytes of the {self.GUARD_BYTES} past its "
                    f"scratch's {plan.nbytes}",
                )


def require_indexer_device(args: argparse.Namespace) -> None:
    """The bench's preflight: a CUDA device the indexer kernels run on."""
    import torch

    from b12x.attention import dsa_indexer as di

    if not torch.cuda.is_available() or not di.is_supported():
        raise Unavailable("no supported CUDA device: nothing to measure")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.set_defaults(preflight=require_indexer_device)
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=sorted(CASES))
    p.add_argument("--iters", type=positive_int, default=50, help="timed replays per arm")
    p.add_argument(
        "--torch-iters", type=positive_int, default=10, help="timed replays of the torch arm"
    )
    p.add_argument("--no-torch", action="store_true", help="skip the torch arm")
    p.add_argument(
        "--no-deepgemm",
        action="store_true",
        help="skip the stock vLLM peer (DeepGEMM logits + vLLM's top-k)",
    )
    p.add_argument(
        "--page-order",
        choices=PAGE_ORDERS,
        default="random",
        help="how each page-table row orders its (distinct) page ids: random, as a long-running "
        "server's allocator leaves them, or ascending, as a fresh one hands them out",
    )
    p.add_argument(
        "--flavor-arms",
        nargs="*",
        default=[],
        choices=FLAVORS,
        help="extra b12x arms with the scorers' MMA flavor forced (e.g. f16 next to wgmma)",
    )


def make_inputs(
    case: Case, device: str = "cuda", page_order: str = "random"
) -> tuple[torch.Tensor, ...]:
    """A case's operands: every page of the cache is some row's, once (prefill's
    rows share one table row); ``page_order`` says how a table row orders its
    ids (:data:`PAGE_ORDERS`)."""
    import torch

    g = torch.Generator(device=device).manual_seed(1234)
    rows, heads, width = case.rows, case.heads, case.width
    table_rows = 1 if case.prefill else rows
    n_pages = table_rows * width
    q = (torch.randn(rows, heads, 128, device=device, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, device=device, generator=g) * heads**-0.5
    k = (torch.randn(n_pages, PAGE, 128, device=device, generator=g) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(n_pages, PAGE, device=device, generator=g) + 0.05
    kcache = torch.empty((n_pages, PAGE_BYTES), dtype=torch.uint8, device=device)
    kcache[:, :8192] = k.view(torch.uint8).reshape(n_pages, 8192)
    kcache[:, 8192:] = scales.view(torch.uint8).reshape(n_pages, 256)
    table = torch.randperm(n_pages, device=device, generator=g).int().reshape(table_rows, width)
    if page_order == "ascending":
        table = table.sort(dim=1).values
    elif page_order != "random":
        raise ValueError(f"page_order expected one of {PAGE_ORDERS}, got {page_order!r}")
    if case.prefill:
        table = table.expand(rows, width)
    lengths = torch.tensor(case.lengths(), dtype=torch.int32, device=device)
    aw = torch.tensor([max(case.lengths())], dtype=torch.int32, device=device)
    return q, w, kcache, table, lengths, aw


def case_caps(case: Case, precision: str = "exact", device: str = "cuda") -> Any:
    """The indexer caps of a bench case (``di.Caps``)."""
    from b12x.attention import dsa_indexer as di

    return di.Caps(
        device=device,
        num_q_heads=case.heads,
        max_q_rows=case.rows,
        max_page_table_width=case.width,
        topk=case.topk,
        mode="prefill" if case.prefill else "decode",
        precision=precision,
    )


def bind_case(
    plan: Any,
    inputs: tuple[torch.Tensor, ...],
    scratch: torch.Tensor,
    output_indices: torch.Tensor,
    output_scores: torch.Tensor | None = None,
) -> Any:
    """``di.bind`` of ``plan`` over a case's inputs (:func:`make_inputs`)."""
    from b12x.attention import dsa_indexer as di

    q, w, kcache, table, lengths, aw = inputs
    return di.bind(
        plan,
        scratch=scratch,
        q_fp8=q,
        query_weights=w,
        index_k_cache=kcache,
        page_table=table,
        cache_lengths=lengths,
        active_width=aw,
        output_indices=output_indices,
        output_scores=output_scores,
    )


def torch_indexer(
    q: torch.Tensor,
    w: torch.Tensor,
    kcache: torch.Tensor,
    table: torch.Tensor,
    lengths: torch.Tensor,
    topk: int,
    row_block: int = 256,
) -> torch.Tensor:
    """The PyTorch path: gather -> bf16 GEMM per head -> relu*w -> sum -> scale -> mask -> topk."""
    import torch

    rows, _heads, _ = q.shape
    width = table.shape[1]
    pages = kcache.shape[0]
    k_all = kcache[:, :8192].view(torch.float8_e4m3fn).reshape(pages, PAGE, 128)
    s_all = kcache[:, 8192:].contiguous().view(torch.float32).reshape(pages, PAGE)
    pos = torch.arange(width * PAGE, device=q.device)
    outs = []
    for r0 in range(0, rows, row_block):
        r1 = min(rows, r0 + row_block)
        tb = table[r0:r1].long()
        if table.stride(0) == 0:  # one shared table: gather once
            k = k_all[tb[0]].to(torch.bfloat16).reshape(1, width * PAGE, 128)
            s = s_all[tb[0]].reshape(1, width * PAGE)
        else:
            k = k_all[tb].to(torch.bfloat16).reshape(r1 - r0, width * PAGE, 128)
            s = s_all[tb].reshape(r1 - r0, width * PAGE)
        dots = torch.matmul(q[r0:r1].to(torch.bfloat16), k.transpose(1, 2))  # [b, heads, T]
        logits = (torch.relu(dots.float()) * w[r0:r1, :, None]).sum(1) * s
        logits = logits.masked_fill(pos[None, :] >= lengths[r0:r1, None], -math.inf)
        outs.append(torch.topk(logits, topk, dim=1).indices.int())
    return torch.cat(outs)


def floors_us(case: Case) -> tuple[float, float]:
    lengths = case.lengths()
    pages_read = (1 if case.prefill else case.rows) * case.width
    q_bytes = case.rows * case.heads * (128 + 4)
    out_bytes = case.rows * case.topk * 8
    hbm = (pages_read * PAGE_BYTES + q_bytes + out_bytes) / HBM_BYTES_PER_S * 1e6
    flop = 2.0 * case.heads * 128 * sum(lengths)
    return hbm, flop / MMA_FLOP_PER_S * 1e6


def topk_only_arms(
    result: BenchResult,
    case: Case,
    caps: Any,
    binding: Any,
    bind: Callable[..., Any],
    args: argparse.Namespace,
    timer: ArmTimer,
    extra: dict[str, Any],
) -> None:
    """The top-k stage alone on the logits the b12x arm left in its scratch:
    ``topk_only:b12x`` (b12x's selection kernels, through a plan that skips
    the scorers) and ``topk_only:torch`` (``torch.topk`` over the same logits,
    positions past each row's length masked to -inf beforehand). One-chunk
    plans only: the scratch then holds every logit of the call."""
    import torch

    from b12x import _core
    from b12x.attention import dsa_indexer as di

    if binding.plan.max_chunks != 1:
        result.notes.append(f"{case.name}: topk_only arms skipped (the plan has several chunks)")
        return
    stage = bind(_core.indexer_build_plan(caps, topk_only=True), scratch=binding.scratch)
    samples = timer(partial(di.run, stage))
    timer.then(lambda: result.add(case.name, "topk_only:b12x", samples, **extra))
    if args.no_torch:
        return
    logits = di.scratch_views(binding)["logits"][: case.rows, : case.context]
    pos = torch.arange(case.context, device=logits.device)
    lengths = torch.tensor(case.lengths(), device=logits.device)
    masked = logits.masked_fill(pos[None, :] >= lengths[:, None], -math.inf)

    def torch_topk(masked: torch.Tensor = masked, k: int = case.topk) -> None:
        torch.topk(masked, k, dim=1)

    torch_samples = timer(torch_topk, args.torch_iters)
    timer.then(lambda: result.add(case.name, "topk_only:torch", torch_samples, **extra))


def score_only_arms(
    result: BenchResult,
    case: Case,
    caps_of: Callable[[str], Any],
    bind: Callable[..., Any],
    timer: ArmTimer,
    extra: dict[str, Any],
) -> None:
    """The scorers alone: ``score_only:b12x`` and ``score_only:b12x_fast``,
    through plans that skip the top-k (``indexer_build_plan(score_only=True)``).
    Skipped, with the reason, where this b12x has no such plan."""
    from b12x import _core
    from b12x.attention import dsa_indexer as di

    # Any: the option is new (main adds it to _core); older builds raise TypeError
    build_plan: Any = _core.indexer_build_plan
    for arm, precision in (("score_only:b12x", "exact"), ("score_only:b12x_fast", "fast")):
        try:
            plan = build_plan(caps_of(precision), score_only=True)
        except TypeError as e:
            if "score_only" not in str(e):
                raise
            note = f"score_only arms skipped: _core.indexer_build_plan has no score_only ({e})"
            if note not in result.notes:
                result.notes.append(note)
            return
        samples = timer(partial(di.run, bind(plan)))
        fields = {**extra, "mma_flavor": plan.mma_flavor, "precision": precision}
        timer.then(partial(result.add, case.name, arm, samples, **fields))


def torch_arm(
    result: BenchResult,
    case: Case,
    inputs: tuple[torch.Tensor, ...],
    timer: ArmTimer,
    exact: tuple[Samples, torch.Tensor],
    extra: dict[str, Any],
    iters: int,
) -> None:
    """``torch``, what a user would write (:func:`torch_indexer`), and its
    agreement with the ``b12x`` arm's selection (bf16 GEMM in the torch arm:
    near-ties may differ): ``exact`` is that arm's samples and its indices,
    which it writes again before the comparison (the arms share them)."""
    q, w, kcache, table, lengths, _aw = inputs
    ref: dict[str, torch.Tensor] = {}

    def torch_call() -> None:
        ref["idx"] = torch_indexer(q, w, kcache, table, lengths, case.topk)

    samples = timer(torch_call, iters)

    def finish() -> None:
        samples.rerun()
        exact_samples, idx = exact
        exact_samples.rerun()
        b = result.row(case.name, "b12x")
        overlap = min(
            len(set(a.tolist()) & set(c.tolist())) / case.topk
            for a, c in zip(idx[:64].cpu(), ref["idx"][:64].cpu(), strict=True)
        )
        t = result.add(case.name, "torch", samples, **extra)
        b["topk_overlap_min"] = overlap
        t["topk_overlap_min"] = overlap
        b["speedup_vs_torch"] = t["median_us"] / b["median_us"]
        hbm, mma = extra["hbm_floor_us"], extra["fp8_floor_us"]
        result.notes.append(
            f"{case.name}: b12x {b['median_us']:.1f} us, torch {t['median_us']:.1f} us "
            f"({b['speedup_vs_torch']:.1f}x), HBM floor {hbm:.1f} us, FP8 floor {mma:.1f} us"
        )

    timer.then(finish)


def peer_env(args: argparse.Namespace, dev: int) -> peers.PeerEnv:
    """The peers this run measures against (DeepGEMM, vLLM's ops), found once."""
    import torch

    capability = torch.cuda.get_device_capability(dev)
    if args.no_deepgemm:
        deep_gemm = peers.Found(None, "skipped (--no-deepgemm)")
        vllm_ops = peers.Found(None, "skipped (--no-deepgemm)")
    else:
        deep_gemm = peers.import_deep_gemm()
        if deep_gemm.ok and peers.enable_pdl_as_vllm(deep_gemm.module, capability):
            deep_gemm = peers.Found(deep_gemm.module, deep_gemm.detail + ", PDL on as in vLLM")
        vllm_ops = peers.import_vllm_ops()
    return peers.PeerEnv(
        deep_gemm=deep_gemm,
        vllm_ops=vllm_ops,
        stored=peers.load_stored_topk(),
        device_name=torch.cuda.get_device_name(dev),
        capability=capability,
        sms=torch.cuda.get_device_properties(dev).multi_processor_count,
    )


def run(args: argparse.Namespace) -> BenchResult:
    import torch

    from b12x import _core
    from b12x.attention import dsa_indexer as di

    config = {
        "cases": args.cases,
        "iters": args.iters,
        "timing": TIMING,
        "page_order": args.page_order,
    }
    result = BenchResult("indexer", config)
    result.columns = TABLE_COLUMNS
    dev = torch.cuda.current_device()
    flush = l2_flusher(dev)
    env = peer_env(args, dev)
    result.config["peers"] = peers.peer_summary(env)
    for name, found in (("stock vLLM peer", env.deep_gemm), ("vLLM's compiled ops", env.vllm_ops)):
        if not found.ok:
            result.notes.append(f"{name}: {found.detail}")

    for name in args.cases:
        case = CASES[name]
        inputs = make_inputs(case, page_order=args.page_order)

        def caps_of(precision: str = "exact", case: Case = case) -> Any:
            return case_caps(case, precision, device=f"cuda:{dev}")

        caps = caps_of()
        plan = di.plan(caps)
        idx = torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda")
        sc = torch.empty((case.rows, case.topk), device="cuda")

        guards = ScratchGuards()

        def bind(plan: Any, scratch: torch.Tensor | None = None, idx: torch.Tensor = idx,
                 sc: torch.Tensor = sc, inputs: tuple[torch.Tensor, ...] = inputs,
                 guards: ScratchGuards = guards) -> Any:  # fmt: skip
            if scratch is None:
                scratch = guards.scratch(plan)
            return bind_case(plan, inputs, scratch, idx, sc)

        binding = bind(plan)
        hbm, mma = floors_us(case)
        floors = {"hbm_floor_us": hbm, "fp8_floor_us": mma}
        extra = {
            **floors,
            "supertile": plan.supertile_tokens,
            "slices": plan.topk_slices,
            "mma_flavor": plan.mma_flavor,
        }
        # every arm of the case is declared here and timed interleaved (timer.run)
        timer = ArmTimer(args.iters, flush)

        def whole_call(arm: str, samples: Samples, tie_rel: float, fields: dict[str, Any],
                       name: str = name, idx: torch.Tensor = idx,
                       inputs: tuple[torch.Tensor, ...] = inputs,
                       topk: int = case.topk) -> None:  # fmt: skip
            """A whole-call b12x row, its selection checked: the arms share
            ``idx``, so its graph runs once more first."""
            samples.rerun()
            row = result.add(name, arm, samples, **fields)
            peers.check_selection(result, row, name, arm, idx, inputs, topk, tie_rel)

        exact = timer(partial(di.run, binding))
        timer.then(partial(whole_call, "b12x", exact, peers.EXACT_TIE_REL, extra))
        topk_only_arms(result, case, caps, binding, bind, args, timer, extra)
        score_only_arms(result, case, caps_of, bind, timer, extra)
        fast_plan = di.plan(caps_of("fast"))
        fast = timer(partial(di.run, bind(fast_plan)))
        # fast logits carry FP8 accumulation error, as DeepGEMM's do
        fast_fields = {**extra, "mma_flavor": fast_plan.mma_flavor, "precision": "fast"}
        timer.then(partial(whole_call, "b12x_fast", fast, peers.LOGITS_REL_TOL, fast_fields))
        for flavor in args.flavor_arms:
            try:
                forced_plan = _core.indexer_build_plan(caps, mma_flavor=flavor)
            except ConfigError as e:
                # a TMA flavor past its row blocks (the core's Plan says so);
                # any other refusal is the caller's to see
                if "mma_flavor expected a flavor that serves" not in str(e):
                    raise
                result.notes.append(f"{name}: no b12x_{flavor} arm: {e}")
                continue
            forced = bind(forced_plan)
            samples = timer(partial(di.run, forced))
            fields = {**extra, "mma_flavor": flavor}
            timer.then(partial(result.add, name, f"b12x_{flavor}", samples, **fields))
        if not args.no_torch:
            torch_arm(result, case, inputs, timer, (exact, idx), extra, args.torch_iters)
        indexer_stock.peer_arms(result, case, inputs, env, timer, floors)
        timer.run()
        guards.check(result, name)
        stock = [r for r in result.results if r["case"] == name and r["arm"] == "stock_vllm"]
        if stock:
            result.notes.append(
                f"{name}: stock vLLM {stock[0]['median_us']:.1f} us "
                f"(top-k {stock[0]['topk_kernel']}, {stock[0]['topk_source']}); "
                f"b12x {result.row(name, 'b12x')['vs_stock']:.2f}x of it"
            )
        del timer, guards, binding, inputs
        torch.cuda.empty_cache()
    return result
