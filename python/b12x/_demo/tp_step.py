"""The layer step on 2+ GPUs (one spawned process each): a row-parallel output
projection, then all-reduce + residual add + RMSNorm, fused through
:class:`~b12x.integration.vllm.PcieAllReduce` and compared against NCCL
all-reduce + a separate RMSNorm, eagerly and as CUDA graph replays."""

from __future__ import annotations

import statistics
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from b12x._demo import StepResult
from b12x.bench.common import capture_graph, gpu_time_us
from b12x.comm.local_group import free_port, init_local_group
from b12x.comm.pcie.invocation import FUSED

if TYPE_CHECKING:
    from b12x.comm.pcie import Invocation

HIDDEN = 7168
ATTN_OUT = 128 * 128  # heads x value head dim feeding o_proj (split over ranks)
EPS = 1e-6
ROWS = (1, 4, 16)
TIMEOUT_S = 120  # the whole layer step takes ~10 s on 2x H200
ERROR_GRACE_S = 15


def tp_step(gpus: int | None = None) -> StepResult:
    name = "layer step: fused all-reduce + RMSNorm vs NCCL"
    if not torch.cuda.is_available():
        return StepResult(name, "gpus", "skipped: no CUDA GPU", status="skip")
    count = torch.cuda.device_count()
    world = count if gpus is None else min(gpus, count)
    if world < 2:
        return StepResult(name, "gpus", f"skipped: needs 2+ GPUs (found {count})", status="skip")
    try:
        from b12x.comm.pcie import AllReduce, DeclaredPlanIndex  # noqa: F401
    except ImportError as e:
        return StepResult(
            name,
            f"{world} GPUs",
            f"skipped: the all-reduce runtime is not in this build ({e})",
            status="skip",
        )
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, queue)) for r in range(world)]
    for p in procs:
        p.start()
    reports: dict[int, Any] = {}
    errors: list[str] = []
    try:
        for _ in range(world):
            # Once one rank has failed, its peers may wait on it forever (e.g.
            # in NCCL init): give them a short grace period, not the full bound.
            rank, report, error = queue.get(timeout=ERROR_GRACE_S if errors else TIMEOUT_S)
            reports[rank] = report
            if error:
                errors.append(f"rank {rank}: {error.strip().splitlines()[-1]}")
    except Exception as e:  # queue.Empty: a rank hung or died without reporting
        missing = sorted(set(range(world)) - set(reports))
        errors.append(f"no report from rank(s) {missing} in time ({type(e).__name__})")
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.terminate()
            errors.append(f"pid {p.pid} did not exit")
    where = f"{world} GPUs"
    if errors:
        return StepResult(name, where, "; ".join(errors), status="FAIL")
    report = reports[0]
    if "skipped" in report:
        return StepResult(name, where, f"skipped: {report['skipped']}", status="skip")
    if not report["rows"]:
        why = f"skipped: no fused declaration of rows {ROWS} is routed under the current limits"
        return StepResult(name, where, why, status="skip")
    parts = [
        f"r{rows}: {'ok' if r['ok'] else 'MISMATCH'} (max err {r['max_err']:.3g}), "
        f"{r['fused_us']:.1f} vs {r['nccl_us']:.1f} us"
        + ("" if r["nccl_mode"] == "graph" else " (NCCL eager)")
        for rows, r in report["rows"].items()
    ]
    ok = all(r["ok"] for r in report["rows"].values()) and report["all_ranks_ok"]
    summary = (
        f"TP{world}, hidden {HIDDEN} bf16; eager + graph replay with new inputs; "
        "fused vs NCCL+RMSNorm per graph replay: " + "; ".join(parts)
    )
    return StepResult(name, where, summary, "see result", "ok" if ok else "FAIL")


def _worker(rank: int, world: int, port: int, queue: Any) -> None:
    import torch.distributed as dist

    try:
        init_local_group(rank, world, port)
        queue.put((rank, _layer_step(rank, world), None))
    except Exception:
        queue.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _OutputLayer:
    """Row-parallel o_proj of one layer and the RMSNorm weight after it."""

    def __init__(self, world: int, device: torch.device) -> None:
        g = torch.Generator().manual_seed(7)
        full = torch.randn((HIDDEN, ATTN_OUT), generator=g) * ATTN_OUT**-0.5
        self.o_proj = full.to(torch.bfloat16)  # every rank slices its own columns
        self.norm_weight = torch.linspace(0.5, 1.5, HIDDEN).to(torch.bfloat16).to(device)
        self.device = device
        self.world = world

    def local_weight(self, rank: int) -> torch.Tensor:
        cols = ATTN_OUT // self.world
        weight: torch.Tensor = self.o_proj[:, rank * cols : (rank + 1) * cols]
        return weight.contiguous().to(self.device)

    def describe(self, workload: Any) -> list[Invocation]:
        from b12x.comm.pcie import Invocation

        return [
            Invocation(
                name=f"layers.0.o_proj_add_rms_norm.m{rows}",
                operation=FUSED,
                shape=(rows, HIDDEN),
                dtype=torch.bfloat16,
                norm_weight=self.norm_weight,
                epsilon=EPS,
            )
            for rows in workload.token_counts
        ]


def _graph_us(fn: Callable[[], object], device: torch.device, repeats: int = 100) -> float:
    """Median us of a graph replay of one ``fn`` call."""
    graph = capture_graph(fn, device=device, warmup=False)
    return _replay_us(graph, repeats)


def _replay_us(graph: torch.cuda.CUDAGraph, repeats: int = 100) -> float:
    return statistics.median(gpu_time_us(graph.replay, repeats, sync_each=True))


def _layer_step(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from b12x._demo.lookup_step import Workload
    from b12x.integration.vllm import PcieAllReduce

    device = torch.device("cuda", rank)
    comm = PcieAllReduce(dist.group.WORLD, device)
    if comm.disabled:
        return {"skipped": "PcieAllReduce disabled itself (see the log)"}
    layer = _OutputLayer(world, device)
    comm.register_describer(layer, layer.describe)
    routes = comm.prepare(Workload(ROWS))
    report: dict[str, Any] = {"rows": {}}
    ok_all = True
    for rows in ROWS:
        if f"layers.0.o_proj_add_rms_norm.m{rows}" in routes:
            case = _RowsCase(comm, layer, rank, rows)
            report["rows"][rows] = case.run()
            ok_all = ok_all and report["rows"][rows]["ok"]
    flag = torch.tensor([1 if ok_all else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    report["all_ranks_ok"] = bool(flag.item())
    comm.close()
    return report


class _RowsCase:
    """One batch size: eager, graph replays with new inputs, and timings."""

    def __init__(self, comm: Any, layer: _OutputLayer, rank: int, rows: int) -> None:
        self.comm, self.layer, self.rows = comm, layer, rows
        self.device = layer.device
        self.weight = layer.local_weight(rank)
        self.g = torch.Generator(device=self.device).manual_seed(100 + rank)
        shared = torch.Generator(device=self.device).manual_seed(5 + rows)
        self.residual0 = torch.randn((rows, HIDDEN), generator=shared, device=self.device)
        self.residual0 = self.residual0.bfloat16()

    def partial(self) -> torch.Tensor:
        attn = torch.randn((self.rows, self.weight.shape[1]), generator=self.g, device=self.device)
        return attn.bfloat16() @ self.weight.T

    def reference(self, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        import torch.distributed as dist

        from b12x.integration.vllm import add_rms_norm_

        out, res = p.clone(), self.residual0.clone()
        dist.all_reduce(out)
        add_rms_norm_(out, res, self.layer.norm_weight, EPS)
        return out, res

    def fused(self, x: torch.Tensor, res: torch.Tensor) -> bool:
        return bool(self.comm.try_fused_add_rms_norm(x, res, self.layer.norm_weight, EPS))

    @staticmethod
    def close(got: torch.Tensor, want: torch.Tensor) -> tuple[bool, float]:
        err = float((got.float() - want.float()).abs().max())
        return bool(torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)), err

    def run(self) -> dict[str, Any]:
        import torch.distributed as dist

        from b12x.integration.vllm import add_rms_norm_

        p = self.partial()
        want, want_res = self.reference(p)
        x, res = p.clone(), self.residual0.clone()
        ok = self.fused(x, res)
        ok_x, err = self.close(x, want)
        ok_r, _ = self.close(res, want_res)
        ok = ok and ok_x and ok_r
        # Capture once, then replay with new inputs written into the captured buffers.
        static_x, static_res = p.clone(), self.residual0.clone()
        graph = capture_graph(
            lambda: self.fused(static_x, static_res),
            device=self.device,
            warmup=False,
            scope=self.comm.capture(),
        )
        for _ in range(2):
            p = self.partial()
            want, want_res = self.reference(p)
            static_x.copy_(p)
            static_res.copy_(self.residual0)
            graph.replay()
            ok_x, err_x = self.close(static_x, want)
            ok_r, _ = self.close(static_res, want_res)
            ok, err = ok and ok_x and ok_r, max(err, err_x)
        fused_us = _replay_us(graph)
        nccl_x, nccl_res = p.clone(), self.residual0.clone()

        def nccl_step() -> None:
            dist.all_reduce(nccl_x)
            add_rms_norm_(nccl_x, nccl_res, self.layer.norm_weight, EPS)

        try:
            nccl_us = _graph_us(nccl_step, self.device)
            nccl_mode = "graph"
        except Exception:  # NCCL capture unsupported here: time it eagerly instead
            torch.cuda.synchronize(self.device)
            nccl_us = statistics.median(gpu_time_us(nccl_step, 100, sync_each=True))
            nccl_mode = "eager"
        return {
            "ok": ok,
            "max_err": err,
            "fused_us": fused_us,
            "nccl_us": nccl_us,
            "nccl_mode": nccl_mode,
        }
