"""Shared benchmark plumbing: timing, metadata, table and JSON output."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


@dataclasses.dataclass
class BenchResult:
    name: str
    config: dict[str, Any]
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    ok: bool = True

    def add(self, case: str, arm: str, samples_us: list[float], **extra: Any) -> dict[str, Any]:
        row = {
            "case": case,
            "arm": arm,
            "median_us": statistics.median(samples_us),
            "samples_us": list(samples_us),
            **extra,
        }
        self.results.append(row)
        return row

    def median(self, case: str, arm: str) -> float:
        for row in self.results:
            if row["case"] == case and row["arm"] == arm:
                return row["median_us"]
        raise KeyError((case, arm))


def time_per_call_us(
    fn: Callable[[], object], number: int, repeats: int, warmup: int = 100
) -> list[float]:
    """Host-side microseconds per call: ``repeats`` samples of ``number`` calls each."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3 / number)
    return samples


def source_hash() -> str:
    """sha256 over the installed b12x Python sources and the extension binary."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in {".py", ".so", ".pyd"}:
            h.update(path.relative_to(root).as_posix().encode())
            h.update(path.read_bytes())
    return h.hexdigest()


def meta(config: dict[str, Any]) -> dict[str, Any]:
    from b12x import _core

    m: dict[str, Any] = {
        "config": config,
        "python": platform.python_version(),
        "cpu": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "versions": {"b12x": _core.__version__},
        "source_hash": source_hash(),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import torch

        m["versions"]["torch"] = torch.__version__
        if torch.cuda.is_available():
            m["device"] = torch.cuda.get_device_name()
            m["versions"]["driver_cuda"] = "{}.{}".format(*_core.driver_version())
        else:
            m["device"] = "cpu"
    except ImportError:
        m["device"] = "cpu"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    m["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return m


def write_report(result: BenchResult, json_path: str | None) -> None:
    rows = result.results
    extra_keys = sorted({k for r in rows for k in r} - {"case", "arm", "median_us", "samples_us"})
    header = ["case", "arm", "median_us", "min_us", *extra_keys]
    table = [header]
    for r in rows:
        table.append(
            [r["case"], r["arm"], f"{r['median_us']:.3f}", f"{min(r['samples_us']):.3f}"]
            + [_fmt(r.get(k)) for k in extra_keys]
        )
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header))]
    print(f"b12x bench {result.name}")
    for i, row in enumerate(table):
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)))
        if i == 0:
            print("  ".join("-" * w for w in widths))
    for note in result.notes:
        print(note)
    if json_path:
        doc = {"meta": meta(result.config), "results": rows}
        Path(json_path).write_text(json.dumps(doc, indent=1))
        print(f"wrote {json_path}")


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3f}"
    return "" if v is None else str(v)
