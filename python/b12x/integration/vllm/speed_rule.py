"""When the vLLM plugin uses b12x's indexer: only where it is not slower than stock.

vLLM 0.33's own sparse indexer on CUDA runs DeepGEMM's logits kernels and
vLLM's top-k, and needs DeepGEMM (without it vLLM's indexer refuses to
build). So, per GPU architecture:

* stock vLLM has no fast path there (DeepGEMM absent, or vLLM does not run
  it on that architecture): b12x serves, it is the only fast path;
* otherwise b12x serves only where every committed benchmark of that
  architecture (``bench-results/<gpu>/indexer.json``, one a GPU model,
  distilled into ``indexer_figures.json`` beside this module) shows b12x at
  least as fast as stock vLLM on every case of every serving mode, at the
  precision the plugin plans with; a mode with no stock figure counts as not
  shown. The rule keys on the architecture, not the GPU model, so one GPU
  where b12x is slower leaves the architecture to vLLM. One layer's indexer
  serves both modes (b12x's metadata builder replaces vLLM's for the layer),
  so one slower mode leaves the whole layer to vLLM.

:func:`decide` is pure; :func:`stock_fast_path` asks vLLM (inside vLLM) or
the installed files (``b12x doctor``) whether stock has its DeepGEMM path.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "PLAN_PRECISION",
    "Decision",
    "arch_name",
    "decide",
    "figures_from_bench",
    "load_figures",
    "stock_fast_path",
]

FIGURES_FILE = Path(__file__).with_name("indexer_figures.json")
REPO_FIGURES_FILE = "python/b12x/integration/vllm/indexer_figures.json"
# The committed benchmarks each architecture's figures come from, one a GPU model.
BENCH_FILES = {"sm_90": ("bench-results/h200/indexer.json", "bench-results/h100/indexer.json")}
# bench arms by the precision the plugin plans with
ARMS = {"exact": "b12x", "fast": "b12x_fast"}
STOCK_ARM = "stock_vllm"
# One layer serves both; a mode without a single case is not shown at least as fast.
SERVING_MODES = ("decode", "prefill")
# The precision the vLLM adapter builds its Caps with (indexer.py passes it):
# "fast", the peer of what it replaces. Stock vLLM's logits come from
# DeepGEMM's FP8 MMAs, whose accumulation keeps less than fp32 too (~3e-4
# relative to an fp32 reference on an H200, against b12x fast's ~2.5e-4);
# "exact" (fp32 accumulation of exact products) is b12x's own offer to
# direct callers and more than stock vLLM gives its users.
PLAN_PRECISION = "fast"
# vLLM 0.33 runs DeepGEMM on Hopper and the Blackwell families (platforms/cuda.py).
STOCK_DEEPGEMM_ARCHS = ((9, 0), (10, None), (12, None))


@dataclass(frozen=True)
class Decision:
    """Whether b12x's indexer serves on an architecture, and why, in words."""

    use_b12x: bool
    reason: str


def arch_name(capability: tuple[int, int]) -> str:
    return f"sm_{capability[0]}{capability[1]}"


def figures_from_bench(bench: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The figures the rule reads, from a ``b12x bench indexer --json`` result:
    per case its mode and the median microseconds of each precision's b12x
    arm and of the stock vLLM arm (None where the run had no such arm)."""
    medians: dict[str, dict[str, float]] = {}
    for row in bench["results"]:
        medians.setdefault(row["case"], {})[row["arm"]] = float(row["median_us"])
    cases = {}
    for case, arms in sorted(medians.items()):
        cases[case] = {
            "mode": case.split("_", 1)[0],
            **{f"{p}_us": arms.get(arm) for p, arm in ARMS.items()},
            "stock_us": arms.get(STOCK_ARM),
        }
    meta = bench["meta"]
    return {
        "source": source,
        "device": meta.get("device"),
        "timestamp": meta.get("timestamp"),
        "cases": cases,
    }


def load_figures() -> dict[str, Any]:
    """The committed figures by architecture name (``sm_90``: one table a
    GPU model, as :func:`figures_from_bench` gives it)."""
    with FIGURES_FILE.open() as f:
        figures: dict[str, Any] = json.load(f)
    return figures


def _runs_deepgemm(capability: tuple[int, int]) -> bool:
    return any(
        capability[0] == major and (minor is None or capability[1] == minor)
        for major, minor in STOCK_DEEPGEMM_ARCHS
    )


def _fmt(us: float | None) -> str:
    return "no figure" if us is None else f"{us:.1f} us"


def decide(
    capability: tuple[int, int],
    precision: str,
    stock_has_deepgemm: bool,
    figures: Mapping[str, Any] | None = None,
) -> Decision:
    """Whether the plugin should use b12x's indexer on a GPU of ``capability``.

    Parameters
    ----------
    capability
        The GPU's compute capability.
    precision
        The precision the plugin's plans use (``"exact"`` or ``"fast"``).
    stock_has_deepgemm
        Whether DeepGEMM is importable where vLLM runs.
    figures
        By architecture, one table a benchmarked GPU model (default: the
        committed ones); every one of them must show b12x at least as fast.
    """
    arch = arch_name(capability)
    if not (stock_has_deepgemm and _runs_deepgemm(capability)):
        why = "DeepGEMM is not installed" if not stock_has_deepgemm else f"vLLM runs none on {arch}"
        return Decision(True, f"stock vLLM has no fast indexer here ({why})")
    tables = (load_figures() if figures is None else figures).get(arch)
    if not tables:
        return Decision(False, f"no committed benchmark of b12x against stock vLLM on {arch}")
    slower = []
    for table in tables:
        misses = _not_shown(table, precision)
        if misses:
            slower.append(f"{_where(table)}: " + "; ".join(misses))
    if slower:
        return Decision(
            False,
            f"not shown at least as fast as stock vLLM on {arch} ({precision} precision): "
            + " | ".join(slower),
        )
    where = "; ".join(_where(t) for t in tables)
    return Decision(True, f"at least as fast as stock vLLM on {arch} in every case ({where})")


def _where(table: Mapping[str, Any]) -> str:
    return f"{table['device']}, {table['source']}"


def _not_shown(table: Mapping[str, Any], precision: str) -> list[str]:
    """The serving modes and cases of one GPU's table where b12x is not shown
    at least as fast as stock (a missing figure is not shown)."""
    measured = {c["mode"] for c in table["cases"].values()}
    misses = [f"{mode}: no figures" for mode in SERVING_MODES if mode not in measured]
    for case, c in table["cases"].items():
        ours, stock = c.get(f"{precision}_us"), c.get("stock_us")
        if ours is None or stock is None or ours > stock:
            misses.append(f"{case}: b12x {_fmt(ours)}, stock {_fmt(stock)}")
    return misses


def stock_fast_path(inside_vllm: bool) -> bool:
    """Whether DeepGEMM is importable for vLLM: vLLM's own check inside vLLM;
    for ``b12x doctor``, whether the files are there, without importing vLLM."""
    if inside_vllm:
        from vllm.utils.import_utils import has_deep_gemm

        return bool(has_deep_gemm())
    if importlib.util.find_spec("deep_gemm") is not None:
        return True
    spec = importlib.util.find_spec("vllm")  # a top-level lookup imports nothing
    if spec is None or not spec.submodule_search_locations:
        return False
    return any(
        (Path(p) / "third_party" / "deep_gemm" / "__init__.py").exists()
        for p in spec.submodule_search_locations
    )


def main() -> int:
    """Rewrites the repository's ``indexer_figures.json`` from its committed
    benchmarks (``python -m b12x.integration.vllm.speed_rule [REPO_ROOT]``)."""
    import sys

    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    target = root / REPO_FIGURES_FILE
    target.write_text(render_figures(root))
    print(f"wrote {target}")
    return 0


def render_figures(root: Path) -> str:
    """``indexer_figures.json`` as the committed benchmarks under ``root`` give it."""
    table = {}
    for arch, rels in BENCH_FILES.items():
        table[arch] = [
            figures_from_bench(json.loads((root / rel).read_text()), rel) for rel in rels
        ]
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
