"""Never slower for a vLLM user: where b12x's indexer serves a vLLM layer.

Per (GPU architecture, serving mode) b12x's indexer is chosen only where the
committed bench results for that architecture (``bench-results/<gpu>/indexer.json``,
``b12x bench indexer``) show it at least as fast as stock vLLM on every case
of the mode, at the precision the adapter builds its caps with
(:data:`~b12x.integration.vllm.indexer.PRECISION`). Where stock vLLM has no
fast path for the architecture (no DeepGEMM: vLLM 0.33's
``CudaPlatform.support_deep_gemm()`` is sm_90, the sm_10x family and the
sm_12x family) b12x is used. Where vLLM has DeepGEMM but there are no
figures, vLLM's own path is kept: no figures never count as a win.

The figures live in a small package table (``indexer_speed.json``) built from
the bench files by :func:`build_table` (``python -m
b12x.integration.vllm.indexer_choice``); a test checks the two agree.

The decision is per layer: a layer runs b12x's indexer only where both modes
choose b12x. One vLLM layer cannot run b12x for decode and vLLM's path for
prefill: its index-cache backend and metadata builder serve both modes
(b12x's builder flattens decode and makes one prefill chunk per request, a
chunking vLLM's DeepGEMM prefill path is not sized for), and vLLM's op
handles both modes in one call.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

__all__ = [
    "MODES",
    "SOURCES",
    "TABLE_PATH",
    "Choice",
    "arch_name",
    "build_table",
    "choose",
    "layer_reason",
    "load_table",
    "table_text",
    "vllm_has_deepgemm",
]

MODES = ("decode", "prefill")
#: Architecture -> the committed bench file its figures come from (repository paths).
SOURCES = {"sm_90": "bench-results/h200/indexer.json"}
_ARMS = {"exact": "b12x", "fast": "b12x_fast"}
_STOCK = "stock_vllm"
_TABLE = "indexer_speed.json"


def arch_name(capability: tuple[int, int]) -> str:
    """``(9, 0)`` -> ``"sm_90"``."""
    return f"sm_{capability[0]}{capability[1]}"


def vllm_has_deepgemm(capability: tuple[int, int]) -> bool:
    """Whether stock vLLM 0.33 runs DeepGEMM's indexer kernels on this GPU
    (``CudaPlatform.support_deep_gemm``: exactly sm_90, or the 10.x or 12.x family)."""
    return capability == (9, 0) or capability[0] in (10, 12)


def build_table(bench: dict[str, Any], arch: str) -> dict[str, Any]:
    """The figures of one ``b12x bench indexer`` JSON, by mode and case:
    ``{"arch", "device", "modes": {mode: {case: {arm: median_us}}}}`` with the
    arms b12x, b12x_fast and stock_vllm where the file has them."""
    modes: dict[str, dict[str, dict[str, float]]] = {}
    for row in bench["results"]:
        case, arm = row["case"], row["arm"]
        mode = case.split("_", 1)[0]
        if mode in MODES and arm in (*_ARMS.values(), _STOCK):
            modes.setdefault(mode, {}).setdefault(case, {})[arm] = round(row["median_us"], 3)
    return {"arch": arch, "device": bench["meta"].get("device"), "modes": modes}


def load_table() -> dict[str, dict[str, Any]]:
    """The committed figures, by architecture."""
    text = resources.files(__package__).joinpath(_TABLE).read_text()
    table: dict[str, dict[str, Any]] = json.loads(text)
    return table


@dataclass(frozen=True)
class Choice:
    """Whether b12x serves ``mode`` on ``arch``, and why."""

    arch: str
    mode: str
    b12x: bool
    why: str


def _choose_mode(
    arch: str, mode: str, figures: dict[str, dict[str, float]] | None, arm: str
) -> Choice:
    cases = figures or {}
    missing = [c for c, arms in cases.items() if arm not in arms or _STOCK not in arms]
    if not cases or missing:
        return Choice(arch, mode, False, f"no b12x vs stock vLLM figures for {mode} on {arch}")
    slower = {c: arms for c, arms in cases.items() if arms[arm] > arms[_STOCK]}
    shown = ", ".join(
        f"{c}: b12x {a[arm]:.1f} us vs vLLM {a[_STOCK]:.1f} us" for c, a in sorted(cases.items())
    )
    if slower:
        return Choice(arch, mode, False, f"stock vLLM is faster for {mode} on {arch} ({shown})")
    return Choice(arch, mode, True, f"b12x is at least as fast for {mode} on {arch} ({shown})")


def choose(
    capability: tuple[int, int],
    precision: str,
    table: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Choice]:
    """The choice of each mode on a GPU of ``capability`` for caps of ``precision``."""
    arch = arch_name(capability)
    if not vllm_has_deepgemm(capability):
        why = f"stock vLLM has no DeepGEMM fast path on {arch}"
        return {m: Choice(arch, m, True, why) for m in MODES}
    entry = (load_table() if table is None else table).get(arch, {})
    modes = entry.get("modes", {})
    return {m: _choose_mode(arch, m, modes.get(m), _ARMS[precision]) for m in MODES}


def layer_reason(
    capability: tuple[int, int],
    precision: str,
    table: dict[str, dict[str, Any]] | None = None,
) -> str | None:
    """Why a layer keeps vLLM's own indexer on this GPU (a mode b12x does not
    win), or None when b12x serves both modes."""
    lost = [c for c in choose(capability, precision, table).values() if not c.b12x]
    if not lost:
        return None
    return "; ".join(c.why for c in lost) + " (one layer serves both modes)"


def table_text(root: Path) -> str:
    """The table built from the bench files under the repository ``root``."""
    table = {
        arch: build_table(json.loads((root / path).read_text()), arch)
        for arch, path in sorted(SOURCES.items())
    }
    return json.dumps(table, indent=1, sort_keys=True) + "\n"


#: Where the table lives in the repository.
TABLE_PATH = f"python/b12x/integration/vllm/{_TABLE}"

if __name__ == "__main__":  # python -m b12x.integration.vllm.indexer_choice [REPO_ROOT]
    root = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    (root / TABLE_PATH).write_text(table_text(root))
    print(f"wrote {root / TABLE_PATH}")
