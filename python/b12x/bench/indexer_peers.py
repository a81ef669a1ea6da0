"""Stock vLLM 0.33's Hopper indexer as the peer of ``b12x bench indexer``: which peers this
machine has, what vLLM would run, the stored top-k figures, the checks and the ratios.

vLLM 0.33 scores with DeepGEMM and selects with its own top-k kernels; the
calls themselves, made exactly as vLLM makes them, and the arms that time
them are in :mod:`b12x.bench.indexer_stock`.

* DeepGEMM is found as vLLM finds it: ``deep_gemm`` first, then the copy in
  vLLM's wheel, ``vllm.third_party.deep_gemm`` (:func:`import_deep_gemm`).
* vLLM's compiled top-k and K-gather ops come from ``vllm._C_stable_libtorch``
  (:func:`import_vllm_ops`); where it does not import (it is 92 MB and does
  not travel to the GPU hosts) the stock row uses the stored figure of the
  top-k kernel vLLM would run (:func:`vllm_topk_kernel`), from
  ``vllm_topk_h200.json`` (:func:`load_stored_topk`), and says so.
* Every whole-call b12x row gets ``vs_stock``; the stage arms get ``vs_peer``
  (:func:`attach_ratios`).
"""

from __future__ import annotations

import importlib
import importlib.resources
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from b12x.bench.common import BenchResult


class Measure(Protocol):
    """A case's timer (:class:`b12x.bench.interleave.ArmTimer`): declaring an
    arm runs its step at least once, outside any timing, and returns the list
    its samples (microseconds per call) fill once the case's arms are timed;
    ``then`` declares what runs after that timing, in order."""

    def __call__(self, fn: Callable[[], object], /) -> list[float]: ...

    def then(self, finish: Callable[[], object], /) -> None: ...


STORED_TOPK_FILE = "vllm_topk_h200.json"
DEEP_GEMM_MODULES = ("deep_gemm", "vllm.third_party.deep_gemm")
DEEP_GEMM_NAMES = (
    "fp8_fp4_paged_mqa_logits",
    "get_paged_mqa_logits_metadata",
    "fp8_fp4_mqa_logits",
)
# The library vLLM's CUDA platform imports; it registers these ops (namespace, name).
VLLM_OPS_MODULE = "vllm._C_stable_libtorch"
VLLM_OPS = (
    ("_C", "cooperative_topk"),
    ("_C", "persistent_topk"),
    ("_C", "top_k_per_row_prefill"),
    ("_C_cache_ops", "cp_gather_indexer_k_quant_cache"),
)
# vLLM 0.33's constants for its top-k kernels (indexer_topk.py): the radix
# kernels' top-k sizes, cooperative_topk's row limit, their shared workspace.
RADIX_TOPKS = (512, 1024, 2048)
COOPERATIVE_MAX_ROWS = 64
TOPK_WORKSPACE_BYTES = 1024 * 1024
# DeepGEMM's logits differ from float32 by ~3e-4 of their magnitude (FP8
# accumulation, measured on H200); a wrong call is off by far more.
LOGITS_REL_TOL = 1e-3
# b12x's exact logits are float32 sums of exact products: a selection may swap
# only keys this close to the boundary (summation order).
EXACT_TIE_REL = 1e-5
CHECK_ROWS = 64


@dataclass(frozen=True)
class Found:
    """A peer: the module (or op table), or None and the reason in ``detail``."""

    module: Any
    detail: str

    @property
    def ok(self) -> bool:
        return self.module is not None


def import_deep_gemm(import_module: Callable[[str], Any] = importlib.import_module) -> Found:
    """DeepGEMM, looked up in vLLM's order; ``detail`` says which, or why none."""
    errors = []
    for name in DEEP_GEMM_MODULES:
        try:
            module = import_module(name)
        except Exception as e:  # also RuntimeError: its JIT include folder missing
            errors.append(f"{name}: {type(e).__name__}: {e}")
            continue
        version = getattr(module, "__version__", "unknown version")
        missing = [n for n in DEEP_GEMM_NAMES if not hasattr(module, n)]
        if missing:
            errors.append(f"{name} {version} has no {', '.join(missing)}")
            continue
        where = getattr(module, "__file__", None) or "?"
        return Found(module, f"{name} {version} ({where})")
    return Found(
        None,
        "DeepGEMM does not import (" + "; ".join(errors) + "); see the README, 'The DeepGEMM peer'",
    )


def enable_pdl_as_vllm(dg: Any, capability: tuple[int, int]) -> bool:
    """vLLM turns DeepGEMM's programmatic dependent launch on for sm_90 and newer."""
    on = capability[0] >= 9
    set_pdl = getattr(dg, "set_pdl", None)
    if set_pdl is None:
        return False
    set_pdl(on)
    return on


def import_vllm_ops(
    import_module: Callable[[str], Any] = importlib.import_module,
    namespace: Callable[[str], Any] | None = None,
) -> Found:
    """vLLM's compiled top-k and K-gather ops (``{name: op}``), or why not.

    ``namespace(ns)`` is ``torch.ops.<ns>`` (tests pass fakes). A stand-in
    library (``B12X_STAND_IN``, tools/gpu/vllm_bundle.py) registers no op and
    is reported as such.
    """
    try:
        library = import_module(VLLM_OPS_MODULE)
    except Exception as e:
        return Found(None, f"{VLLM_OPS_MODULE} does not import ({type(e).__name__}: {e})")
    if getattr(library, "B12X_STAND_IN", False) is True:
        return Found(None, f"{VLLM_OPS_MODULE} is a stand-in on this host: it registers no ops")
    if namespace is None:
        import torch

        def namespace(ns: str) -> Any:
            return getattr(torch.ops, ns)

    ops = {}
    for ns, name in VLLM_OPS:
        op = getattr(namespace(ns), name, None)
        if op is None:
            return Found(None, f"torch.ops.{ns}.{name} is not registered by {VLLM_OPS_MODULE}")
        ops[name] = op
    return Found(ops, f"live: {VLLM_OPS_MODULE}")


# --- which top-k vLLM runs, and the stored figures ------------------------------------------


def vllm_topk_kernel(
    *, prefill: bool, rows: int, topk: int, logits_row_stride: int, capability: tuple[int, int]
) -> str:
    """The top-k kernel vLLM 0.33 runs, its top-k backend left at ``auto``.

    Prefill chunks always go to ``top_k_per_row_prefill`` (the indexer's
    prefill branch calls it directly). Decode takes ``cooperative_topk``
    where it applies (top-k 512/1024/2048, at most 64 rows, a row stride
    divisible by 4, sm_90 or newer outside the sm_12x family), else
    ``persistent_topk`` for those top-k sizes, else ``top_k_per_row_decode``.
    """
    if prefill:
        return "top_k_per_row_prefill"
    major = capability[0]
    cooperative = (
        topk in RADIX_TOPKS
        and rows <= COOPERATIVE_MAX_ROWS
        and logits_row_stride % 4 == 0
        and major >= 9
        and major != 12
    )
    if cooperative:
        return "cooperative_topk"
    if topk in RADIX_TOPKS:
        return "persistent_topk"
    return "top_k_per_row_decode"


# what a stored figure is, said once in every row that uses one
STORED_TOPK_TIMING = (
    "vLLM 0.33.0's kernel alone on this case's float32 logits, graph replay, L2 flushed "
    "before each replay (b12x/bench/vllm_topk_h200.json has the provenance)"
)


@dataclass(frozen=True)
class StoredTopk:
    """vLLM's top-k kernels timed alone, from ``vllm_topk_h200.json``."""

    device: str
    label: str  # what a row's topk_source says
    medians: Mapping[str, Mapping[str, float]]  # case -> kernel -> median us

    def lookup(self, case: str, kernel: str, device: str) -> tuple[float | None, str]:
        """``(median_us, "")`` or ``(None, why there is no figure)``."""
        if self.device not in device:
            return None, f"the stored vLLM top-k figures are for {self.device}, not {device}"
        figure = self.medians.get(case, {}).get(kernel)
        if figure is None:
            return None, f"no stored figure of vLLM's {kernel} for {case}"
        return figure, ""

    def best(self, case: str) -> tuple[str, float] | None:
        figures = self.medians.get(case)
        if not figures:
            return None
        kernel = min(figures, key=lambda k: figures[k])
        return kernel, figures[kernel]


def load_stored_topk(text: str | None = None) -> StoredTopk:
    """The stored figures (``text``: the file's contents; default: the packaged file)."""
    if text is None:
        text = importlib.resources.files("b12x.bench").joinpath(STORED_TOPK_FILE).read_text()
    doc = json.loads(text)
    prov = doc["provenance"]
    medians = {
        case: {kernel: float(fig["median_us"]) for kernel, fig in kernels.items()}
        for case, kernels in doc["cases"].items()
    }
    label = f"stored: {STORED_TOPK_FILE} ({prov['device']}, {prov['timestamp'][:10]})"
    return StoredTopk(device=str(prov["device"]), label=label, medians=medians)


# --- checks --------------------------------------------------------------------------------


def logits_rel_err(got: torch.Tensor, ref: torch.Tensor, lengths: list[int]) -> float:
    """Worst row's ``max |got - ref| / max |ref|`` over its first ``lengths[i]`` columns."""
    import torch

    width = max(max(lengths), 1)
    g = got[:, :width].float()
    r = ref[:, :width].float().to(g.device)
    cols = torch.arange(width, device=g.device)
    live = cols[None, :] < torch.tensor(lengths, device=g.device)[:, None]
    zero = torch.zeros((), device=g.device)
    err = torch.where(live, (g - r).abs(), zero).amax(dim=1)
    scale = torch.where(live, r.abs(), zero).amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny)
    return float((err / scale).max())


def check_rows(rows: int, count: int = CHECK_ROWS) -> list[int]:
    """``count`` rows spread over ``rows`` (all of them when fewer), first and last included."""
    if rows <= count:
        return list(range(rows))
    return sorted({round(i * (rows - 1) / (count - 1)) for i in range(count)})


def reference_logits(
    inputs: tuple[torch.Tensor, ...], rows: list[int]
) -> tuple[torch.Tensor, list[int]]:
    """Float32 logits of ``rows`` (b12x's reference) and their lengths."""
    import torch

    from b12x.attention.dsa_indexer import reference

    q, w, kcache, table, lengths, _aw = inputs
    sel = torch.tensor(rows, device=q.device)
    ref = reference.paged_logits(q[sel], w[sel], kcache, table[sel], lengths[sel])
    return ref, [int(v) for v in lengths[sel].tolist()]


def selection_error(
    out: torch.Tensor, inputs: tuple[torch.Tensor, ...], topk: int, tie_rel: float
) -> tuple[int, str | None]:
    """A top-k output against the float32 reference on :func:`check_rows`
    rows, keys within ``tie_rel`` of the rows' largest |logit| of the boundary
    free to swap: the rows checked, and what differs (None: nothing)."""
    import torch

    from b12x.attention.dsa_indexer import reference

    rows = check_rows(out.shape[0])
    ref, lengths = reference_logits(inputs, rows)
    cols = torch.arange(ref.shape[1], device=ref.device)
    cand = cols[None, :] < torch.tensor(lengths, device=ref.device)[:, None]
    got = out.index_select(0, torch.tensor(rows, device=out.device))
    tie = tie_rel * float(torch.where(cand, ref.abs(), 0.0).max())
    try:
        reference.assert_topk_equivalent(got, None, ref, cand, topk, tie_atol=tie, tie_rtol=0.0)
    except AssertionError as e:
        return len(rows), str(e)
    return len(rows), None


def fail_check(result: BenchResult, case: str, what: str) -> None:
    """A check failed: the run exits 1 and its notes say which."""
    result.ok = False
    result.notes.append(f"{case}: CHECK FAILED: {what}")


def check_selection(
    result: BenchResult,
    fields: dict[str, Any],
    case: str,
    arm: str,
    out: torch.Tensor,
    inputs: tuple[torch.Tensor, ...],
    topk: int,
    tie_rel: float,
) -> None:
    """An arm's selection ``out`` checked by :func:`selection_error`:
    ``check_rows`` / ``check_ok`` (and ``check_error``) into the arm's
    ``fields``; a failure fails the run."""
    n, err = selection_error(out, inputs, topk, tie_rel)
    fields.update(check_rows=n, check_ok=err is None)
    if err is not None:
        fields["check_error"] = err[:200]
        fail_check(result, case, f"{arm}'s selection: {err}")


@dataclass(frozen=True)
class PeerEnv:
    """What the peer arms need besides the case: the peers found, the stored
    figures and the device (name, compute capability, SMs)."""

    deep_gemm: Found
    vllm_ops: Found
    stored: StoredTopk
    device_name: str
    capability: tuple[int, int]
    sms: int


# --- ratios --------------------------------------------------------------------------------


def is_whole_call_b12x(arm: str) -> bool:
    """``b12x``, ``b12x_fast`` and the forced-flavor ``b12x_<flavor>`` arms."""
    return arm == "b12x" or arm.startswith("b12x_")


def attach_ratios(rows: list[dict[str, Any]], case: str) -> None:
    """``vs_stock`` (median / ``stock_vllm``'s) on every whole-call b12x row of
    ``case`` (None without a stock row); ``vs_peer`` and ``peer`` on the stage
    arms: ``score_only:*`` against ``deepgemm_logits``, ``topk_only:b12x``
    against the top-k figure inside ``stock_vllm``."""
    by_arm = {r["arm"]: r for r in rows if r["case"] == case}
    stock = by_arm.get("stock_vllm")
    logits = by_arm.get("deepgemm_logits")
    for arm, row in by_arm.items():
        median = float(row["median_us"])
        if is_whole_call_b12x(arm):
            row["vs_stock"] = None if stock is None else median / float(stock["median_us"])
        elif arm.startswith("score_only:"):
            row["peer"] = None if logits is None else "deepgemm_logits"
            row["vs_peer"] = None if logits is None else median / float(logits["median_us"])
        elif arm == "topk_only:b12x":
            if stock is None:
                row["peer"], row["vs_peer"] = None, None
            else:
                row["peer"] = f"vLLM {stock['topk_kernel']} ({stock['topk_source'].split(':')[0]})"
                row["vs_peer"] = median / float(stock["topk_us"])


def peer_summary(env: PeerEnv) -> dict[str, str]:
    """What the run's JSON config says about its peers."""
    return {
        "deep_gemm": env.deep_gemm.detail,
        "vllm_ops": env.vllm_ops.detail,
        "stored_topk": env.stored.label,
    }
