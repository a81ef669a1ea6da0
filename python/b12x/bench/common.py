"""Shared benchmark plumbing: host and GPU timing, metadata, table and JSON output."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch


@dataclasses.dataclass
class BenchResult:
    name: str
    config: dict[str, Any]
    results: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    ok: bool = True
    # extra row keys the printed table shows, in order (None: every key); JSON keeps them all
    columns: list[str] | None = None

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

    def row(self, case: str, arm: str) -> dict[str, Any]:
        for row in self.results:
            if row["case"] == case and row["arm"] == arm:
                return row
        raise KeyError((case, arm))

    def median(self, case: str, arm: str) -> float:
        return float(self.row(case, arm)["median_us"])


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


class TimingEvent(Protocol):
    """What :func:`gpu_time_us` needs of an event (``torch.cuda.Event``)."""

    def record(self) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed_time(self, end_event: Any, /) -> float: ...  # milliseconds


def cuda_event() -> TimingEvent:
    import torch

    return torch.cuda.Event(enable_timing=True)


def cuda_synchronize() -> None:
    import torch

    torch.cuda.synchronize()


def gpu_time_us(
    step: Callable[[], object],
    samples: int,
    *,
    repeat: int = 1,
    per_step: int = 1,
    warmup: int = 0,
    flush: Callable[[], object] | None = None,
    sync_each: bool = False,
    event: Callable[[], TimingEvent] = cuda_event,
    synchronize: Callable[[], object] = cuda_synchronize,
) -> list[float]:
    """GPU microseconds per operation: ``samples`` samples, each a pair of CUDA
    events on the current stream around ``repeat`` calls of ``step``.

    Parameters
    ----------
    step
        One call: an eager launch or ``graph.replay``.
    per_step
        Operations one ``step`` performs (a graph of N captured calls is N);
        each sample is divided by ``repeat * per_step``.
    warmup
        Untimed ``step`` calls first (then a synchronize).
    flush
        Called before each sample, outside its events (e.g. :func:`l2_flusher`).
    sync_each
        Wait for each sample before enqueuing the next, so every sample starts
        on an idle GPU and includes the launch latency; otherwise samples run
        back to back and one synchronize ends them all.
    event, synchronize
        The event factory and the device-wide wait (tests pass fakes).
    """
    for _ in range(warmup):
        step()
    if warmup:
        synchronize()
    pairs = []
    for _ in range(samples):
        if flush is not None:
            flush()
        start, end = event(), event()
        start.record()
        for _ in range(repeat):
            step()
        end.record()
        if sync_each:
            end.synchronize()
        pairs.append((start, end))
    synchronize()
    ops = repeat * per_step
    return [start.elapsed_time(end) * 1e3 / ops for start, end in pairs]


def capture_graph(
    fn: Callable[[], object],
    *,
    calls: int = 1,
    device: torch.device | int | None = None,
    warmup: bool = True,
    scope: contextlib.AbstractContextManager[object] | None = None,
) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``calls`` back-to-back calls of ``fn``, captured on a
    side stream of ``device`` (default: the current device).

    ``warmup`` runs ``fn`` once on that stream first, outside the capture
    (allocator and lazy initialisation); ``scope`` is entered around the
    capture (e.g. ``AllReduce.capture()``). The caller's stream waits for the
    side stream afterwards. The graph is not replayed here.
    """
    import torch

    current = torch.cuda.current_stream(device)
    side = torch.cuda.Stream(device)
    side.wait_stream(current)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(side):
        if warmup:
            fn()
        with scope or contextlib.nullcontext(), torch.cuda.graph(graph, stream=side):
            for _ in range(calls):
                fn()
    current.wait_stream(side)
    return graph


def time_graph_us(
    fn: Callable[[], object],
    samples: int,
    *,
    calls: int = 1,
    warmup: int = 1,
    flush: Callable[[], object] | None = None,
    device: torch.device | int | None = None,
) -> list[float]:
    """Microseconds per call of ``fn``: captured ``calls`` times in one CUDA
    graph (:func:`capture_graph`), replayed ``warmup`` times, then ``samples``
    timed replays (:func:`gpu_time_us`; ``flush`` before each, untimed)."""
    graph = capture_graph(fn, calls=calls, device=device)
    return gpu_time_us(graph.replay, samples, per_step=calls, warmup=warmup, flush=flush)


def l2_flusher(device: int) -> Callable[[], object]:
    """Rewrites a buffer of twice the L2 size of CUDA ``device`` per call, so
    the next timed sample reads its inputs from HBM, not L2."""
    import torch

    from b12x import _core

    l2 = int(_core.device_info(device)["l2_bytes"])
    buf = torch.zeros(2 * l2 // 4 + 1, dtype=torch.float32, device=torch.device("cuda", device))
    return lambda: buf.add_(1)


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
    present = {k for r in rows for k in r} - {"case", "arm", "median_us", "samples_us"}
    if result.columns is None:
        extra_keys = sorted(present)
    else:
        extra_keys = [k for k in result.columns if k in present]
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
        # small magnitudes (relative errors) keep their digits
        return f"{v:.2e}" if 0 < abs(v) < 1e-3 else f"{v:.3f}"
    return "" if v is None else str(v)
