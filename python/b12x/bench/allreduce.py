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
from pathlib import Path
from typing import Any

from b12x._cli_args import int_at_least, positive_int, require_gpus
from b12x.bench.common import BenchResult
from b12x.comm.local_group import NVLS_OFF, free_port, init_local_group

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
    import torch.multiprocessing as mp

    os.environ.update(NVLS_OFF)
    gpus = args.gpus or torch.cuda.device_count()
    if gpus < 2:
        raise SystemExit(f"bench allreduce: needs >= 2 GPUs, found {gpus}")
    config = {"gpus": gpus, "calls": args.calls, "samples": args.samples, "quick": args.quick}
    result = BenchResult("allreduce", config)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "rank0.json")
        mp.spawn(
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
    def __init__(self, name, operation, shape, dtype, weight=None, eps=None):
        self.name, self.operation, self.shape, self.dtype = name, operation, tuple(shape), dtype
        self.strides, self.input_alignment = None, 16
        self.norm_weight, self.epsilon = weight, eps
        self.channel_id = self.persistent_input = None


def _graph_samples(torch, fn, calls: int, samples: int) -> list[float]:
    """us per call: `samples` replays of a graph of `calls` back-to-back calls."""
    fn()  # warm (outside capture)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    for _ in range(3):
        g.replay()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(samples + 1)]
    events[0].record()
    for i in range(samples):
        g.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    return [events[i].elapsed_time(events[i + 1]) * 1e3 / calls for i in range(samples)]


def _eager_samples(torch, fn, calls: int, samples: int) -> list[float]:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end) * 1e3 / calls)
    return out


def _worker(rank, world, port, out_path, calls, samples, quick):
    import torch
    import torch.distributed as dist

    from b12x.comm.pcie.allreduce import AllReduce, Limits

    init_local_group(rank, world, port)
    rows: list[dict[str, Any]] = []
    notes: list[str] = []
    bf16 = torch.bfloat16
    oneshot_bytes = ONESHOT_BYTES[::3] if quick else ONESHOT_BYTES
    twoshot_bytes = TWOSHOT_BYTES[::2] if quick else TWOSHOT_BYTES
    fused_rows = [1, 16] if quick else FUSED_ROWS

    def add(case, arm, samples_us, **extra):
        rows.append({"case": case, "arm": arm, "samples_us": samples_us, "world": world, **extra})

    def measure(case, arm, fn, eager=False, **extra):
        dist.barrier()
        try:
            timer = _eager_samples if eager else _graph_samples
            add(case, arm, timer(torch, fn, calls, samples), **extra)
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
        [_Inv(f"o{n}", "all_reduce", (n // 2,), bf16) for n in oneshot_bytes]
        + [
            _Inv(f"f{r}", "all_reduce_fused_add_rms_norm", (r, HIDDEN), bf16, weight, eps)
            for r in fused_rows
        ]
    )
    for ar in (two, two_pull):
        ar.declare([_Inv(f"t{n}", "all_reduce", (n // 2,), bf16) for n in twoshot_bytes])

    symm = _symm_mem(torch, dist, max(TWOSHOT_BYTES) // 2, notes)
    group_name = dist.group.WORLD.group_name

    for nbytes in oneshot_bytes:
        x = torch.randn(nbytes // 2, device="cuda").to(bf16)
        y = torch.empty_like(x)
        for mode in ("graph", "eager"):
            if mode == "eager" and nbytes not in EAGER_BYTES:
                continue
            case = f"oneshot_{nbytes}B_{mode}"
            eager = mode == "eager"
            measure(case, "b12x", lambda x=x, y=y: one.all_reduce(x, y), eager, bytes=nbytes)
            measure(case, "nccl", lambda x=x: dist.all_reduce(x), eager, bytes=nbytes)
            if symm is not None and not eager:
                s = symm[: nbytes // 2]
                s.copy_(x)
                measure(
                    case,
                    "symm_one_shot",
                    lambda s=s: torch.ops.symm_mem.one_shot_all_reduce(s, "sum", group_name),
                    bytes=nbytes,
                )
                measure(
                    case,
                    "symm_two_shot",
                    lambda s=s: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", group_name),
                    bytes=nbytes,
                )

    for nbytes in twoshot_bytes:
        x = torch.randn(nbytes // 2, device="cuda").to(bf16)
        y = torch.empty_like(x)
        case = f"twoshot_{nbytes}B_graph"
        measure(case, "b12x", lambda x=x, y=y: two.all_reduce(x, y), bytes=nbytes)
        measure(case, "b12x_pull", lambda x=x, y=y: two_pull.all_reduce(x, y), bytes=nbytes)
        measure(case, "nccl", lambda x=x: dist.all_reduce(x), bytes=nbytes)
        if symm is not None:
            s = symm[: nbytes // 2]
            s.copy_(x)
            measure(
                case,
                "symm_two_shot",
                lambda s=s: torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", group_name),
                bytes=nbytes,
            )

            def symm_with_copy(s=s, x=x):
                s.copy_(x)
                torch.ops.symm_mem.two_shot_all_reduce_(s, "sum", group_name)

            measure(case, "symm_two_shot+copy", symm_with_copy, bytes=nbytes)

    for r in fused_rows:
        x = torch.randn(r, HIDDEN, device="cuda").to(bf16)
        res = torch.randn(r, HIDDEN, device="cuda").to(bf16)
        case = f"fused_r{r}_h{HIDDEN}_graph"
        extra = {"rows": r, "bytes": r * HIDDEN * 2}
        measure(
            case,
            "b12x",
            lambda x=x, res=res: one.fused_add_rms_norm(x, res, weight, eps),
            **extra,
        )

        def nccl_rmsnorm(x=x, res=res):
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


def _symm_mem(torch, dist, numel, notes):
    """A rendezvoused torch SymmetricMemory bf16 buffer, or None (noted) if unavailable."""
    try:
        import torch.distributed._symmetric_memory as symm_mem

        group_name = dist.group.WORLD.group_name
        buf = symm_mem.empty(numel, dtype=torch.bfloat16, device=torch.device("cuda"))
        symm_mem.rendezvous(buf, group_name)
        buf.normal_()
        return buf
    except Exception as e:
        notes.append(f"torch SymmetricMemory unavailable: {type(e).__name__}: {e}".splitlines()[0])
        return None
