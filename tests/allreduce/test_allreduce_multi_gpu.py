"""Multi-GPU tests of the IPC all-reduce: one process per GPU (spawned), an
NCCL group on 127.0.0.1, results checked against NCCL and a torch reference.

Each spawn is costly (torch import, NCCL init, PTX JIT), so the correctness
scenarios share one spawn and report per scenario; the dead-peer and the
failed-setup tests spawn their own processes.
"""

from __future__ import annotations

import json
import os
import time
import traceback
from pathlib import Path

import pytest
from b12x.comm.local_group import NVLS_OFF, free_port, init_local_group

pytestmark = pytest.mark.multi_gpu

SPAWN_TIMEOUT_S = 180


def _world() -> int:
    import torch

    return min(torch.cuda.device_count(), 8)


def _spawn(fn, world: int, outdir: Path, *extra) -> list[dict]:
    """Runs fn(rank, world, port, outdir, *extra) in `world` processes; returns
    each rank's JSON result (rank<r>.json), or fails the test on a hang."""
    import torch.multiprocessing as mp

    os.environ.update(NVLS_OFF)
    port = free_port()
    ctx = mp.spawn(fn, args=(world, port, str(outdir), *extra), nprocs=world, join=False)
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"{fn.__name__}: processes did not finish in {SPAWN_TIMEOUT_S} s")
    return [json.loads((outdir / f"rank{r}.json").read_text()) for r in range(world)]


def _init(rank: int, world: int, port: int):
    import torch
    import torch.distributed as dist

    init_local_group(rank, world, port)
    return torch, dist


def _write(outdir: str, rank: int, result: dict) -> None:
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))


# ------------------------------------------------------------------ helpers run in workers
class Inv:
    """A declared invocation (what AllReduce.declare reads)."""

    def __init__(self, name, operation, shape, dtype, strides=None, norm_weight=None, eps=None):
        self.name = name
        self.operation = operation
        self.shape = tuple(shape)
        self.dtype = dtype
        self.strides = strides
        self.input_alignment = 16
        self.norm_weight = norm_weight
        self.epsilon = eps
        self.channel_id = None
        self.persistent_input = None


def _agreed(torch, dist, check) -> None:
    """Runs `check` (local assertions), then fails on every rank if it failed on
    any, so a one-rank failure cannot desynchronize the ranks' collectives."""
    error = None
    try:
        check()
    except AssertionError as e:
        error = e
    flag = torch.tensor([0 if error is None else 1], device="cuda")
    dist.all_reduce(flag)
    if error is not None:
        raise error
    if flag.item():
        raise AssertionError("a check failed on another rank")


def _rand(torch, shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def _bits(torch, t):
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _same_on_all_ranks(torch, dist, t, what):
    world = dist.get_world_size()
    gathered = [torch.empty_like(t) for _ in range(world)]
    dist.all_gather(gathered, t.contiguous())
    for r in range(1, world):  # identical on every rank, so no _agreed needed
        assert torch.equal(_bits(torch, gathered[0]), _bits(torch, gathered[r])), (
            f"{what}: rank {r} differs from rank 0"
        )


def _nccl_sum(torch, dist, x):
    ref = x.clone()
    dist.all_reduce(ref)
    return ref


def _check_plain(torch, dist, ar, shape, dtype, seed, graph):
    rank = dist.get_rank()
    what = f"{'graph' if graph else 'eager'} {tuple(shape)} {dtype}"
    inp = _rand(torch, shape, dtype, seed * 131 + rank)
    out = torch.full_like(inp, float("nan"))

    def compare(label):
        ref = _nccl_sum(torch, dist, inp)
        _agreed(
            torch, dist, lambda: torch.testing.assert_close(out, ref, msg=lambda m: f"{label}: {m}")
        )
        _same_on_all_ranks(torch, dist, out, label)

    if not graph:
        ar.all_reduce(inp, out)
        compare(what)
        return
    g = torch.cuda.CUDAGraph()
    with ar.capture(), torch.cuda.graph(g):
        ar.all_reduce(inp, out)
    ptr = out.data_ptr()
    for trial in range(2):  # replays after rewriting the input in place
        inp.copy_(_rand(torch, shape, dtype, seed * 131 + rank + 7919 * (trial + 1)))
        out.fill_(float("nan"))
        g.replay()
        compare(f"{what} replay {trial}")
    assert out.data_ptr() == ptr


def _fused_reference(torch, dist, inp, residual, weight, eps):
    """The kernel's math in torch: fp32 sum over ranks in rank order, plus the
    residual, one rounding for residual_out; RMSNorm of the unrounded sum."""
    gathered = [torch.empty_like(inp) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, inp)
    r = gathered[0].float()
    for t in gathered[1:]:
        r = r + t.float()
    r = r + residual.float()
    out = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return out.to(inp.dtype), r.to(inp.dtype)


def _fused_tol(torch, dtype):
    return dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)


def _check_fused(torch, dist, ar, shape, dtype, weight, eps, seed, graph):
    rank = dist.get_rank()
    what = f"fused {'graph' if graph else 'eager'} {tuple(shape)} {dtype}"
    inp = _rand(torch, shape, dtype, seed * 17 + rank)
    residual = _rand(torch, shape, dtype, seed * 19 + 1000)  # same on every rank
    tol = _fused_tol(torch, dtype)

    def expect(got_out, got_res, exp_out, exp_res, label):
        def check():
            torch.testing.assert_close(got_out, exp_out, **tol, msg=lambda m: f"{label} out: {m}")
            torch.testing.assert_close(got_res, exp_res, msg=lambda m: f"{label} residual: {m}")

        _agreed(torch, dist, check)

    if not graph:
        # separate outputs, then the in-place default
        exp_out, exp_res = _fused_reference(torch, dist, inp, residual, weight, eps)
        out = torch.full_like(inp, float("nan"))
        res_out = torch.full_like(inp, float("nan"))
        ar.fused_add_rms_norm(inp, residual, weight, eps, out=out, residual_out=res_out)
        expect(out, res_out, exp_out, exp_res, what)
        _same_on_all_ranks(torch, dist, out, what)
        got, got_res = ar.fused_add_rms_norm(inp, residual, weight, eps)
        assert got is inp and got_res is residual
        expect(inp, residual, exp_out, exp_res, what + " in place")
        return
    g = torch.cuda.CUDAGraph()
    with ar.capture(), torch.cuda.graph(g):
        ar.fused_add_rms_norm(inp, residual, weight, eps)
    for trial in range(2):
        x = _rand(torch, shape, dtype, seed * 23 + rank + 31 * trial)
        res = _rand(torch, shape, dtype, seed * 29 + 77 * trial)
        exp_out, exp_res = _fused_reference(torch, dist, x, res, weight, eps)
        inp.copy_(x)
        residual.copy_(res)
        g.replay()
        expect(inp, residual, exp_out, exp_res, f"{what} replay {trial}")


ONESHOT_SIZES = [16, 32, 272, 4096, 65536, 262144, 1 << 20, 4 << 20, 32 << 20]
TWOSHOT_SIZES = [32, 4096, 65536, 1 << 20, 4 << 20, 32 << 20]


def _scenario_oneshot(torch, dist, AllReduce, Limits):
    ar = AllReduce(limits=Limits(oneshot_max=32 << 20, fused_max=0, twoshot_max=0), timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for nbytes in ONESHOT_SIZES:
            cases.append(((nbytes // (torch.finfo(dtype).bits // 8),), dtype))
    cases.append(((3, 5, 8), torch.float32))  # n-d, 480 bytes
    ar.declare(Inv(f"c{i}", "all_reduce", s, d) for i, (s, d) in enumerate(cases))
    assert all(p.route == "oneshot" for _, p in ar.plans.declared_plans)
    for i, (shape, dtype) in enumerate(cases):
        _check_plain(torch, dist, ar, shape, dtype, i, graph=False)
        _check_plain(torch, dist, ar, shape, dtype, i, graph=True)
    # out=None allocates; a transposed (dense) view works as a flat buffer
    x = _rand(torch, (64, 32), torch.bfloat16, 5).t()
    ar.declare([Inv("t", "all_reduce", x.shape, x.dtype, strides=x.stride())])
    got = ar.all_reduce(x)
    assert got.stride() == x.stride()
    torch.testing.assert_close(got, _nccl_sum(torch, dist, x.contiguous()))
    ar.close()
    ar.close()  # idempotent
    assert not ar.plans.has_plan_for(x)


def _scenario_twoshot(torch, dist, AllReduce, Limits):
    limits = Limits(oneshot_max=0, fused_max=0, twoshot_max=32 << 20, twoshot_row_elems=8)
    world = dist.get_world_size()
    cases = [(nbytes // 2,) for nbytes in TWOSHOT_SIZES if (nbytes // 2) % (8 * world) == 0]
    cases.append((48, 7168))
    for push in (False, True):
        ar = AllReduce(limits=limits, timeout_s=30, twoshot_push=push)
        assert ar.enabled, ar.disabled_reason
        ar.declare(Inv(f"c{i}", "all_reduce", s, torch.bfloat16) for i, s in enumerate(cases))
        plans = [p for _, p in ar.plans.declared_plans]
        assert [(p.route, p.twoshot_push) for p in plans] == [("twoshot", push)] * len(cases)
        for i, shape in enumerate(cases):
            _check_plain(torch, dist, ar, shape, torch.bfloat16, 100 + i, graph=False)
            _check_plain(torch, dist, ar, shape, torch.bfloat16, 100 + i, graph=True)
        ar.close()


def _scenario_fused(torch, dist, AllReduce, Limits):
    ar = AllReduce(limits=Limits(oneshot_max=0, fused_max=4 << 20, twoshot_max=0), timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    eps = 1e-6
    cases = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for shape in [(1, 7168), (4, 7168), (16, 7168), (5, 4096), (3, 16384), (200, 1024)]:
            cases.append((shape, dtype))
    cases.append(((2, 32768), torch.bfloat16))  # 4 packs per thread
    weights = {}
    invs = []
    for i, (shape, dtype) in enumerate(cases):
        key = (shape[-1], dtype)
        if key not in weights:
            weights[key] = torch.linspace(0.5, 1.5, shape[-1], device="cuda", dtype=dtype)
        invs.append(
            Inv(f"f{i}", "all_reduce_fused_add_rms_norm", shape, dtype, None, weights[key], eps)
        )
    ar.declare(invs)
    assert all(p.route == "oneshot_fused" for _, p in ar.plans.declared_plans)
    for i, (shape, dtype) in enumerate(cases):
        w = weights[(shape[-1], dtype)]
        _check_fused(torch, dist, ar, shape, dtype, w, eps, 300 + i, graph=False)
        _check_fused(torch, dist, ar, shape, dtype, w, eps, 300 + i, graph=True)
    ar.close()


def _scenario_reference_tp2(torch, dist, AllReduce, Limits):
    """The reference's TP2 case (spec §10.8), DMA out of scope."""
    rank, world = dist.get_rank(), dist.get_world_size()
    limits = Limits(oneshot_max=16 << 10, fused_max=72 << 10, twoshot_max=0)
    ar = AllReduce(limits=limits, timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    hidden, eps = 6144, 1e-6
    weight = torch.linspace(0.5, 1.5, hidden, device="cuda", dtype=torch.bfloat16)
    alternate = weight.flip(0)
    invs = []
    for layer in range(40):
        invs += [
            Inv(f"l{layer}.one", "all_reduce", (1, hidden), torch.bfloat16),
            Inv(
                f"l{layer}.fused",
                "all_reduce_fused_add_rms_norm",
                (4, hidden),
                torch.bfloat16,
                norm_weight=weight if layer % 2 == 0 else alternate,
                eps=eps,
            ),
            Inv(f"l{layer}.big", "all_reduce", (16, 4096), torch.bfloat16),
        ]
    ar.declare(invs)
    plans = {}
    for inv, plan in ar.plans.declared_plans:
        plans.setdefault(inv.name.split(".")[1], set()).add(id(plan))
    assert len(plans["one"]) == 1 and len(plans["fused"]) == 1 and "big" not in plans
    total = lambda k: sum(r + k for r in range(world))  # noqa: E731

    x = torch.full((1, hidden), rank + 1.0, device="cuda", dtype=torch.bfloat16)
    out = ar.all_reduce(x)
    assert torch.all(out == total(1)), out
    out = torch.empty_like(x)
    g = torch.cuda.CUDAGraph()
    with ar.capture(), torch.cuda.graph(g):
        ar.all_reduce(x, out)
    for k in (2, 3):
        x.fill_(rank + k)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(out == total(k)), (k, out)

    for w in (weight, alternate):
        inp = _rand(torch, (4, hidden), torch.bfloat16, 50 + rank)
        res = _rand(torch, (4, hidden), torch.bfloat16, 60)
        assert ar.plans.has_plan_for(inp, "all_reduce_fused_add_rms_norm", w, eps)
        exp_out, exp_res = _fused_reference(torch, dist, inp, res, w, eps)
        ar.fused_add_rms_norm(inp, res, w, eps)

        def check(inp=inp, res=res, exp_out=exp_out, exp_res=exp_res):
            torch.testing.assert_close(inp, exp_out, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(res, exp_res)

        _agreed(torch, dist, check)
    assert not ar.plans.has_plan_for(inp, "all_reduce_fused_add_rms_norm", weight.clone(), eps)
    _check_fused(torch, dist, ar, (4, hidden), torch.bfloat16, weight, eps, 70, graph=True)
    # (4, 6144) plain is 48 KB: above one-shot, no two-shot -> NCCL; so is (16, 4096)
    assert not ar.plans.has_plan_for(torch.empty(4, hidden, device="cuda", dtype=torch.bfloat16))
    assert not ar.plans.has_plan_for(torch.empty(16, 4096, device="cuda", dtype=torch.bfloat16))
    ar.close()


def _scenario_reference_layers(torch, dist, AllReduce, Limits):
    """The reference's TP4 two-shot case at this world size: 40 layers of
    (64, 4096) bf16 share one plan; replay values world*k + world*(world-1)/2."""
    rank, world = dist.get_rank(), dist.get_world_size()
    limits = Limits(oneshot_max=16 << 10, fused_max=16 << 10, twoshot_max=768 << 10)
    ar = AllReduce(limits=limits, timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    ar.declare(Inv(f"l{i}", "all_reduce", (64, 4096), torch.bfloat16) for i in range(40))
    plans = {id(p) for _, p in ar.plans.declared_plans}
    assert len(plans) == 1 and ar.plans.declared_plans[0][1].route == "twoshot"
    total = lambda k: sum(r + k for r in range(world))  # noqa: E731
    x = torch.full((64, 4096), rank + 1.0, device="cuda", dtype=torch.bfloat16)
    assert torch.all(ar.all_reduce(x) == total(1))
    out = torch.empty_like(x)
    g = torch.cuda.CUDAGraph()
    with ar.capture(), torch.cuda.graph(g):
        ar.all_reduce(x, out)
    ptr = out.data_ptr()
    for k in (2, 3):
        x.fill_(rank + k)
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(out == total(k)) and out.data_ptr() == ptr, (k, out)
    ar.close()


def _scenario_capture_refusals(torch, dist, AllReduce, Limits):
    from b12x.errors import UndeclaredPlanError

    ar = AllReduce(limits=Limits(oneshot_max=64 << 10, fused_max=0, twoshot_max=0), timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    with pytest.raises(UndeclaredPlanError, match="declared native preparation plan"), ar.capture():
        pass
    ar.declare([Inv("a", "all_reduce", (8, 64), torch.bfloat16)])
    cold = torch.ones(8, 72, device="cuda", dtype=torch.bfloat16)
    assert not ar.plans.has_plan_for(cold)
    with pytest.raises(UndeclaredPlanError, match="no declared plan for"):
        ar.all_reduce(cold)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(UndeclaredPlanError, match="cold"), torch.cuda.graph(g):
        ar.all_reduce(cold)
    # the runtime is still healthy after the refusals
    _check_plain(torch, dist, ar, (8, 64), torch.bfloat16, 9, graph=False)
    ar.close()


def _scenario_auto_transport(torch, dist, AllReduce, Limits):
    """The auto two-shot transport is decided collectively: equal on all ranks."""
    ar = AllReduce(limits=Limits(oneshot_max=4096, fused_max=0, twoshot_max=0), timeout_s=30)
    assert ar.enabled and isinstance(ar.twoshot_push, bool), ar
    flags = [torch.zeros(1, device="cuda") for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([float(ar.twoshot_push)], device="cuda"))
    assert len({f.item() for f in flags}) == 1
    print(
        f"rank {dist.get_rank()}: auto two-shot transport = "
        f"{'push' if ar.twoshot_push else 'pull'}",
        flush=True,
    )
    ar.close()


def _scenario_admission(torch, dist, AllReduce, Limits):
    """admit(): one call finds the declared plan and checks what the key
    cannot (device, alignment, the fused call's residual and weight); a
    closed runtime refuses even a plan it made."""
    from b12x.errors import UndeclaredPlanError

    fused_op = "all_reduce_fused_add_rms_norm"
    limits = Limits(oneshot_max=64 << 10, fused_max=64 << 10, twoshot_max=0)
    ar = AllReduce(limits=limits, timeout_s=30)
    assert ar.enabled, ar.disabled_reason
    hidden, eps, bf16 = 1024, 1e-6, torch.bfloat16
    weight = torch.linspace(0.5, 1.5, hidden, device="cuda", dtype=bf16)
    ar.declare(
        [
            Inv("p", "all_reduce", (8, hidden), bf16),
            Inv("f", fused_op, (4, hidden), bf16, norm_weight=weight, eps=eps),
        ]
    )
    x = torch.ones(8, hidden, device="cuda", dtype=bf16)
    call = ar.admit(x)
    assert call is not None and call.plan is ar.plans.plan_for(x) and call.inp is x
    assert ar.admit(x.cpu()) is None  # the key matches, the device does not
    buf = torch.ones(8 * hidden + 1, device="cuda", dtype=bf16)
    assert ar.admit(buf[1:].view(8, hidden)) is None  # 2 bytes off 16-byte alignment
    assert ar.admit(torch.ones(9, hidden, device="cuda", dtype=bf16)) is None  # undeclared
    assert torch.all(call.run() == dist.get_world_size())  # the admitted launch itself
    inp = torch.ones(4, hidden, device="cuda", dtype=bf16)
    res = torch.zeros_like(inp)
    fused = ar.admit(inp, fused_op, weight, eps, res)
    assert fused is not None and fused.plan.route == "oneshot_fused"
    assert ar.admit(inp, fused_op, weight, eps, inp) is None  # out would alias residual_out
    assert ar.admit(inp, fused_op, weight, eps, res.float()) is None
    assert ar.admit(inp, fused_op, weight, eps) is None  # no residual
    assert ar.admit(inp, fused_op, weight.clone(), eps, res) is None  # another weight object
    out = torch.empty_like(inp)  # a separate output is admitted as its launch checks it
    assert ar.admit(inp, fused_op, weight, eps, res, out).plan is fused.plan
    assert ar.admit(inp, fused_op, weight, eps, res, out.float()) is None
    assert ar.admit(inp, fused_op, weight, eps, res, out.t().contiguous().t()) is None
    assert ar.admit(inp, fused_op, weight, eps, res, res) is None  # out aliases residual_out
    fused.run()
    torch.cuda.synchronize()
    assert torch.all(res == dist.get_world_size())
    ar.close()
    assert ar.admit(x) is None
    with pytest.raises(UndeclaredPlanError, match="closed"):
        ar.all_reduce(x)


SCENARIOS = [
    ("oneshot", _scenario_oneshot),
    ("twoshot", _scenario_twoshot),
    ("fused", _scenario_fused),
    ("reference_tp2", _scenario_reference_tp2),
    ("reference_layers", _scenario_reference_layers),
    ("capture_refusals", _scenario_capture_refusals),
    ("auto_transport", _scenario_auto_transport),
    ("admission", _scenario_admission),
]


def _correctness_worker(rank, world, port, outdir):
    torch, dist = _init(rank, world, port)
    from b12x.comm.pcie.allreduce import AllReduce, Limits

    result = {}
    for name, fn in SCENARIOS:
        t0 = time.monotonic()
        try:
            fn(torch, dist, AllReduce, Limits)
            result[name] = "ok"
        except Exception:
            result[name] = traceback.format_exc()
        result[name + ".seconds"] = round(time.monotonic() - t0, 2)
        dist.barrier()
    _write(outdir, rank, result)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def correctness(tmp_path_factory):
    return _spawn(_correctness_worker, _world(), tmp_path_factory.mktemp("allreduce"))


@pytest.mark.parametrize("scenario", [name for name, _ in SCENARIOS])
def test_against_nccl(correctness, scenario):
    for rank, result in enumerate(correctness):
        assert result[scenario] == "ok", f"rank {rank}:\n{result[scenario]}"


# ------------------------------------------------------------------ dead peer
def _dead_peer_worker(rank, world, port, outdir, timeout_s):
    torch, dist = _init(rank, world, port)
    from b12x.comm.pcie.allreduce import AllReduce, Limits
    from b12x.errors import CollectiveTimeoutError

    ar = AllReduce(
        limits=Limits(oneshot_max=64 << 10, fused_max=0, twoshot_max=0), timeout_s=timeout_s
    )
    ar.declare([Inv("x", "all_reduce", (1024,), torch.float32)])
    x = torch.ones(1024, device="cuda")
    assert torch.all(ar.all_reduce(x) == world)
    ar.synchronize()
    dist.barrier()
    if rank != 0:
        _write(outdir, rank, {"died": True})
        os._exit(0)  # the peer dies before joining the next collective
    result = {"enabled": ar.enabled}
    t0 = time.monotonic()
    ar.all_reduce(x)  # waits for the dead peer, bounded by timeout_s
    try:
        ar.synchronize()
        result["error"] = None
    except CollectiveTimeoutError as e:
        result["error"] = str(e)
    result["seconds"] = time.monotonic() - t0
    try:  # later calls fail fast, without launching
        ar.all_reduce(x)
        result["second_call"] = "no error"
    except CollectiveTimeoutError as e:
        result["second_call"] = type(e).__name__
    ar.close()  # local close: a timed-out peer cannot take part
    _write(outdir, rank, result)
    os._exit(0)  # no NCCL teardown with a dead peer


def test_dead_peer_times_out_on_the_survivor(tmp_path):
    timeout_s = 2.0
    results = _spawn(_dead_peer_worker, _world(), tmp_path, timeout_s)
    r0 = results[0]
    assert r0["enabled"]
    assert r0["error"] is not None and "waited more than 2.000 s for rank" in r0["error"], r0
    # bounded: the wait ends (no hang) and not before the configured bound
    assert timeout_s <= r0["seconds"] < timeout_s + 30, r0
    assert r0["second_call"] == "CollectiveTimeoutError"


# ------------------------------------------------------------------ failed setup
def _failed_setup_worker(rank, world, port, outdir):
    os.environ["B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK"] = "1"
    torch, dist = _init(rank, world, port)
    from b12x.comm.pcie.allreduce import AllReduce
    from b12x.errors import UndeclaredPlanError

    ar = AllReduce()
    ar.declare([Inv("x", "all_reduce", (1024,), torch.float32)])
    x = torch.ones(1024, device="cuda")
    result = {
        "enabled": ar.enabled,
        "reason": ar.disabled_reason,
        "has_plan": ar.plans.has_plan_for(x),
    }
    try:
        ar.all_reduce(x)
        result["call"] = "ran"
    except UndeclaredPlanError as e:
        result["call"] = str(e)
    ar.close()
    ar.close()
    dist.all_reduce(x)  # the group itself still works: NCCL takes the call
    result["nccl"] = x[0].item()
    _write(outdir, rank, result)
    dist.destroy_process_group()


def test_setup_failure_on_one_rank_disables_every_rank(tmp_path):
    world = _world()
    results = _spawn(_failed_setup_worker, world, tmp_path)
    for rank, r in enumerate(results):
        assert r["enabled"] is False, (rank, r)
        assert "failed on rank(s) [1]" in r["reason"], (rank, r)
        assert r["has_plan"] is False
        assert "disabled" in r["call"]
        assert r["nccl"] == world
    assert "test hook" in results[1]["reason"]
