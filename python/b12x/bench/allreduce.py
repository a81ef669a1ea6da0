"""IPC all-reduce latency on N GPUs vs NCCL and torch SymmetricMemory.

Spawns one process per GPU (NCCL group on 127.0.0.1). Graph cases replay a
captured CUDA graph of ``--calls`` back-to-back calls and report microseconds
per call (CUDA events around every replay, ``--samples`` replays); eager cases
time ``--calls`` launches from Python. Arms: ``b12x`` (default transport),
``b12x_pull`` (two-shot with the pull transport), ``nccl``, ``symm_one_shot`` /
``symm_two_shot`` (torch SymmetricMemory in place on its own buffer, where it
runs), ``symm_two_shot+copy`` (the same after copying the input into that
buffer, as a caller whose tensor lives elsewhere must) and, for the fused case,
``nccl+rmsnorm`` (NCCL all-reduce, residual add, ``torch.nn.functional.rms_norm``).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import traceback
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from b12x._cli_args import int_at_least, positive_int, require_gpus
from b12x.bench.common import BenchResult, gpu_time_us, time_graph_us
from b12x.comm.local_group import NVLS_OFF, free_port, init_local_group

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist

ONESHOT_BYTES = [8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10, 1 << 20]
EAGER_BYTES = [8 << 10, 64 << 10, 256 << 10]
TWOSHOT_BYTES = [1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20]
FUSED_ROWS = [1, 2, 4, 8, 16, 64]
HIDDEN = 7168
# (case prefix, sizes, target ratio vs the NCCL arm) from DESIGN.md §5
TARGETS = {"oneshot": 0.6, "fused": 0.6, "twoshot": 0.9}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--gpus", type=int_at_least(2), default=None, help="processes/GPUs (default: all)"
    )
    p.add_argument(
        "--calls", type=positive_int, default=20, help="calls per graph replay / eager sample"
    )
    p.add_argument("--samples", type=positive_int, default=60, help="timed replays per case")
    p.add_argument("--quick", action="store_true", help="fewer sizes (smoke test)")
    # without the GPUs, one line instead of a traceback from a spawned worker
    p.set_defaults(preflight=require_gpus(lambda args: args.gpus or 2))


def run(args: argparse.Namespace) -> BenchResult:
    import torch
    from torch.multiprocessing.spawn import spawn

    os.environ.update(NVLS_OFF)
    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"bench allreduce: needs >= 2 GPUs, found {gpus}")
    config = {"gpus": gpus, "calls": args.calls, "samples": args.samples, "quick": args.quick}
    result = BenchResult("allreduce", config)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rank0.json")
        spawn(
            _worker,
            args=(gpus, free_port(), str(out), args.calls, args.samples, args.quick),
            nprocs=gpus,
            join=True,
        )
        doc = json.loads(out.read_text())
    for row in doc["rows"]:
        result.add(row.pop("case"), row.pop("arm"), row.pop("samples_us"), **row)
    result.notes.extend(doc["notes"])
    result.notes.extend(_verdicts(result))
    return result


def _verdicts(result: BenchResult) -> list[str]:
    lines = []
    for row in result.results:
        if row["arm"] != "b12x" or not row["case"].endswith("_graph"):
            continue
        kind = row["case"].split("_")[0]
        peer = "nccl+rmsnorm" if kind == "fused" else "nccl"
        try:
            ratio = row["median_us"] / result.median(row["case"], peer)
        except KeyError:
            continue
        line = f"{row['case']}: b12x/{peer} = {ratio:.2f}"
        nbytes = row.get("bytes", 0)
        in_range = (
            (kind == "oneshot" and 8 << 10 <= nbytes <= 256 << 10)
            or (kind == "fused" and row.get("rows", 0) <= 16)
            or (kind == "twoshot" and 1 << 20 <= nbytes <= 32 << 20)
        )
        if in_range:
            line += f" (target <= {TARGETS[kind]}: {'met' if ratio <= TARGETS[kind] else 'MISSED'})"
        if kind == "twoshot":
            for arm in ("symm_two_shot", "symm_two_shot+copy"):
                try:
                    symm = row["median_us"] / result.median(row["case"], arm)
                except KeyError:
                    continue
                line += f"; b12x/{arm} = {symm:.2f} ({'met' if symm <= 1 else 'MISSED'})"
        lines.append(line)
    return lines


# ------------------------------------------------------------------ worker
class _Inv:
    """A declared invocation (b12x.comm.pcie.Declaration) without Invocation's checks."""

    def __init__(
        self,
        name: str,
        operation: str,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        weight: torch.Tensor | None = None,
        eps: float | None = None,
    ) -> None:
        self.name, self.operation, self.shape, self.dtype = name, operation, tuple(shape), dtype
        self.strides: tuple[int, ...] | None = None
        self.input_alignment = 16
        self.norm_weight, self.epsilon = weight, eps
        self.channel_id = self.persistent_input = None


def _graph_samples(fn: Callable[[], object], calls: int, samples: int) -> list[float]:
    """us per call: `samples` replays of a graph of `calls` back-to-back calls."""
    return time_graph_us(fn, samples, calls=calls, warmup=3)


def _eager_samples(fn: Callable[[], object], calls: int, samples: int) -> list[float]:
    """us per call: `samples` samples of `calls` launches from Python, each
    started on an idle GPU (so host launch cost counts)."""
    return gpu_time_us(fn, samples, repeat=calls, warmup=5, sync_each=True)


def _worker(
    rank: int, world: int, port: int, out_path: str, calls: int, samples: int, quick: bool
) -> None:
    import torch
    import torch.distributed as dist

    from b12x.comm.pcie import FUSED, PLAIN, AllReduce, Limits

    init_local_group(rank, world, port)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    bf16 = torch.bfloat16
    oneshot_bytes = ONESHOT_BYTES[::3] if quick else ONESHOT_BYTES
    twoshot_bytes = TWOSHOT_BYTES[::2] if quick else TWOSHOT_BYTES
    fused_rows = [1, 16] if quick else FUSED_ROWS

    def add(case: str, arm: str, samples_us: list[float], **extra: Any) -> None:
        rows.append({"case": case, "arm": arm, "samples_us": samples_us, "world": world, **extra})

    def measure(
        case: str, arm: str, fn: Callable[[], object], *, eager: bool = False, **extra: Any
    ) -> None:
        dist.barrier()
        try:
            timer = _eager_samples if eager else _graph_samples
            add(case, arm, timer(fn, calls, samples), **extra)
        except Exception as e:
            notes.append(f"{case} {arm}: not measured ({type(e).__name__}: {e})".splitlines()[0])
            if rank == 0 and os.environ.get("B12X_BENCH_TRACEBACK"):
                traceback.print_exc()
            torch.cuda.synchronize()

    one = AllReduce(limits=Limits(oneshot_max=max(ONESHOT_BYTES), fused_max=1 << 20, twoshot_max=0))
    two_limits = Limits(
        oneshot_max=0, fused_max=0, twoshot_max=max(TWOSHOT_BYTES), twoshot_row_elems=8
    )
    two = AllReduce(limits=two_limits)
    two_pull = AllReduce(limits=two_limits, twoshot_push=False)
    for ar in (one, two, two_pull):
        if not ar.enabled:
            raise RuntimeError(f"b12x all-reduce disabled: {ar.disabled_reason}")
    notes.append(f"b12x two-shot default transport here: {'push' if two.twoshot_push else 'pull'}")
    weight = torch.linspace(0.5, 1.5, HIDDEN, device="cuda", dtype=bf16)
    eps = 1e-6
    one.declare(
        [_Inv(f"o{n}", PLAIN, (n // 2,), bf16) for n in oneshot_bytes]
        + [_Inv(f"f{r}", FUSED, (r, HIDDEN), bf16, weight, eps) for r in fused_rows]
    )
    for ar in (two, two_pull):
        ar.declare([_Inv(f"t{n}", PLAIN, (n // 2,), bf16) for n in twoshot_bytes])

    symm = _symm_mem(max(TWOSHOT_BYTES) // 2, notes)
    group_name = _world().group_name

    for nbytes in oneshot_bytes:
        x = torch.randn(nbytes // 2, device="cuda").to(bf16)
        y = torch.empty_like(x)
        for mode in ("graph", "eager"):
            if mode == "eager" and nbytes not in EAGER_BYTES:
                continue
            case = f"oneshot_{nbytes}B_{mode}"
            eager = mode == "eager"
            measure(case, "b12x", partial(one.all_reduce, x, y), eager=eager, bytes=nbytes)
            measure(case, "nccl", partial(dist.all_reduce, x), eager=eager, bytes=nbytes)
            if symm is not None and not eager:
                s = symm[: nbytes // 2]
                s.copy_(x)
                measure(
                    case,
                    "symm_one_shot",
                    partial(torch.ops.symm_mem.one_shot_all_reduce, s, "sum", group_name),
                    bytes=nbytes,
                )
                measure(
                    case,
                    "symm_two_shot",
                    partial(torch.ops.symm_mem.two_shot_all_reduce_, s, "sum", group_name),
                    bytes=nbytes,
                )

    for nbytes in twoshot_bytes:
        x = torch.randn(nbytes // 2, device="cuda").to(bf16)
        y = torch.empty_like(x)
        case = f"twoshot_{nbytes}B_graph"
        measure(case, "b12x", partial(two.all_reduce, x, y), bytes=nbytes)
        measure(case, "b12x_pull", partial(two_pull.all_reduce, x, y), bytes=nbytes)
        measure(case, "nccl", partial(dist.all_reduce, x), bytes=nbytes)
        if symm is not None:
            s = symm[: nbytes // 2]
            s.copy_(x)
            measure(
                case,
                "symm_two_shot",
                partial(torch.ops.symm_mem.two_shot_all_reduce_, s, "sum", group_name),
                bytes=nbytes,
            )

            def symm_with_copy(s: torch.Tensor = s, x: torch.Tensor = x) -> None:
                s.copy_(x)
                torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", group_name)

            measure(case, "symm_two_shot+copy", symm_with_copy, bytes=nbytes)

    for r in fused_rows:
        x = torch.randn(r, HIDDEN, device="cuda").to(bf16)
        res = torch.randn(r, HIDDEN, device="cuda").to(bf16)
        case = f"fused_r{r}_h{HIDDEN}_graph"
        extra: dict[str, Any] = {"rows": r, "bytes": r * HIDDEN * 2}
        measure(case, "b12x", partial(one.fused_add_rms_norm, x, res, weight, eps), **extra)

        def nccl_rmsnorm(x: torch.Tensor = x, res: torch.Tensor = res) -> torch.Tensor:
            dist.all_reduce(x)
            res.add_(x)
            return torch.nn.functional.rms_norm(res, (HIDDEN,), weight, eps)

        measure(case, "nccl+rmsnorm", nccl_rmsnorm, **extra)

    for ar in (one, two, two_pull):
        ar.close()
    if rank == 0:
        Path(out_path).write_text(json.dumps({"rows": rows, "notes": notes}))
    dist.barrier()
    dist.destroy_process_group()


def _world() -> dist.ProcessGroup:
    import torch.distributed as dist

    world = dist.group.WORLD
    assert world is not None, "init_local_group() ran first"
    return world


def _symm_mem(numel: int, notes: list[str]) -> torch.Tensor | None:
    """A rendezvoused torch SymmetricMemory bf16 buffer, or None (noted) if unavailable."""
    import torch

    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = _world().group_name
        buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=torch.device("cuda"))
        symm_mem.rendezvous(buf, group_name)
        buf.normal_()
        return buf
    except Exception as e:
        notes.append(f"torch SymmetricMemory unavailable: {type(e).__name__}: {e}".splitlines()[0])
        return None
