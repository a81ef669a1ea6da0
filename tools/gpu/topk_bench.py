#!/usr/bin/env python3
"""Standalone harness for the indexer's top-k stage (kernels/indexer_topk.cu).

    python tools/gpu/topk_bench.py build DIR --old OLD.cu --ptxas PTXAS  # here
    python3 topk_bench.py run DIR --out OUT        # on the GPU: checks, then timings
    python3 topk_bench.py summary OUT              # the table of OUT's JSON files

`build` compiles, with the pinned NVRTC of kernels/build_ptx.py, the product
kernels plus the experiment variants of tools/gpu/topk_variants.cu
(`topk_new.ptx`) and, when given `--old FILE`, an earlier indexer_topk.cu
(`topk_old.ptx`, launched with its own parameter block) for a same-run
comparison; with `--ptxas`, each PTX also as an sm_90 cubin (no JIT on the host).

`run` loads the PTX through the driver (ctypes, torch's primary context) and
launches on torch's current stream exactly as rust/cuda/src/indexer.rs does
(fold per chunk, or slice + merge), with the same parameter block. It first
checks every kernel against an exact reference (the unique order: value key
descending, ties to the lowest position, NaN below -inf, -0 == +0,
IDX_NOT_CANDIDATE_BITS never selected) on adversarial cases: several chunks
with a carry, lengths around topk, ties, all-equal rows, +-0, NaN, +-inf,
unmapped positions, physical output and scores; the fold on both stage kinds
(raw fp32 and 16-bit prefixes) and the two-stage slice + merge. Then it times the three
`b12x bench indexer` cases on logits scored the same way (FP8 cache and
queries from `make_inputs`, fp32 products and sums), each arm captured in a
CUDA graph and replayed with a 2x-L2 buffer rewritten before every replay
outside the timed events (as b12x.bench.indexer.time_graph_us), torch.topk
in the same run. Prints a table and writes every sample to OUT/topk.json.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import platform
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

PAGE = 64
NOT_CANDIDATE = -1  # int32 view of IDX_NOT_CANDIDATE_BITS (0xffffffff)
POISON = 3.0e38  # written past the live length: a kernel that reads it selects it
EXPERIMENT_KERNELS = ["topkx_fold_prefix_u4_b1", "topkx_empty"]  # tools/gpu/topk_variants.cu
STAGED_SMEM = 4096 * 4 + 32 * 4 + 8 * 4  # StagedSmem
TOPK_SMEM = 4096 * 4 + 2 * 3072 * 4 + 2 * 32 * 4 + 6 * 4  # TopkSmem (general paths)


# --------------------------------------------------------------------------- build


def build(args: argparse.Namespace) -> int:
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "kernels"))
    import build_ptx  # the pinned NVRTC

    out = Path(args.dir)
    out.mkdir(parents=True, exist_ok=True)
    nvrtc = build_ptx.load_nvrtc()
    inc = [root / "kernels", build_ptx._package_dir("nvidia.cuda_runtime") / "include"]
    ptx = build_ptx.compile_one(nvrtc, root / "tools" / "gpu" / "topk_variants.cu", inc)
    (out / "topk_new.ptx").write_text(ptx)
    print(f"wrote {out / 'topk_new.ptx'} ({len(ptx)} bytes)")
    modules = ["new"]
    if args.old:
        old_src = out / "indexer_topk_old.cu"
        old_src.write_text(Path(args.old).read_text())
        ptx = build_ptx.compile_one(nvrtc, old_src, inc)
        (out / "topk_old.ptx").write_text(ptx)
        print(f"wrote {out / 'topk_old.ptx'} ({len(ptx)} bytes)")
        modules.append("old")
    if args.ptxas:
        import subprocess

        for m in modules:
            src, dst = out / f"topk_{m}.ptx", out / f"topk_{m}.cubin"
            subprocess.run([args.ptxas, "-arch=sm_90", str(src), "-o", str(dst)], check=True)
            print(f"wrote {dst} ({dst.stat().st_size} bytes)")
    return 0


# --------------------------------------------------------------------------- driver


class Driver:
    """The few driver calls the harness needs, in the current (torch) context."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")

    def _check(self, rc: int, what: str) -> None:
        if rc:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else rc}")

    def load(self, image: bytes):
        mod = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(image)
        self._check(self.lib.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
        return mod

    def function(self, mod, name: str):
        f = ctypes.c_void_p()
        self._check(self.lib.cuModuleGetFunction(ctypes.byref(f), mod, name.encode()), name)
        return f

    def attr(self, f, a: int) -> int:
        v = ctypes.c_int()
        self._check(self.lib.cuFuncGetAttribute(ctypes.byref(v), a, f), "cuFuncGetAttribute")
        return v.value

    def shared_opt_in(self) -> int:
        # CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97, device 0
        v = ctypes.c_int()
        self._check(self.lib.cuDeviceGetAttribute(ctypes.byref(v), 97, 0), "cuDeviceGetAttribute")
        return v.value

    def allow_shared(self, f, nbytes: int) -> None:
        # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
        self._check(self.lib.cuFuncSetAttribute(f, 8, nbytes), "cuFuncSetAttribute")

    def launch(self, f, grid, block, smem: int, stream: int, params: bytes) -> None:
        buf = ctypes.create_string_buffer(params, len(params))
        arg = (ctypes.c_void_p * 1)(ctypes.cast(buf, ctypes.c_void_p))
        rc = self.lib.cuLaunchKernel(
            f, *grid, *block, smem, ctypes.c_void_p(stream), arg, ctypes.c_void_p(0)
        )
        self._check(rc, "cuLaunchKernel")


# --------------------------------------------------------------------------- launches


@dataclass(frozen=True)
class Kernels:
    """One way to run the stage: kernel names, stage kinds (raw fp32 or 16-bit
    prefixes), ABI and the hit list capacity (0: the launcher's rule)."""

    name: str
    module: str  # "new" | "old"
    fold: str = "b12x_indexer_topk_fold"
    slice: str = "b12x_indexer_topk_slice"
    merge: str = "b12x_indexer_topk_merge"
    fold_raw: bool = True
    slice_raw: bool = True
    merge_raw: bool = True
    hit_cap: int = 0
    empty: bool = False  # launch topkx_empty only (the launch-overhead floor)

    def hits(self, topk: int) -> int:
        return self.hit_cap or min(8192, 2 * topk + 1024)


def staged_bytes(raw: bool, hit_cap: int, stage_cap: int) -> int:
    return max(STAGED_SMEM + 12 * hit_cap + (4 if raw else 2) * stage_cap, TOPK_SMEM)


def slice_len(supertile: int, slices: int) -> int:
    n = -(-supertile // max(slices, 1))
    return -(-n // 512) * 512


@dataclass
class Stage:
    """Scratch, outputs and launch sequence of one top-k configuration."""

    torch: object
    drv: Driver
    fns: dict
    kern: Kernels
    rows: int
    width: int
    topk: int
    supertile: int
    slices: int
    physical: bool = False
    scores: bool = True
    buf: dict = field(default_factory=dict)

    def __post_init__(self):
        t = self.torch
        dev = "cuda"
        r, k, s = self.rows, self.topk, self.supertile
        self.chunks = max(1, -(-self.width * PAGE // s))
        self.slen = slice_len(s, self.slices)
        b = self.buf
        b["logits"] = t.full((r, s), POISON, dtype=t.float32, device=dev)
        b["carry_v"] = t.full((2, r, k), float("nan"), dtype=t.float32, device=dev)
        b["carry_i"] = t.full((2, r, k), 7777, dtype=t.int32, device=dev)
        p = max(self.slices, 1)
        b["part_v"] = t.full((r, p, k), float("nan"), dtype=t.float32, device=dev)
        b["part_i"] = t.full((r, p, k), 7777, dtype=t.int32, device=dev)
        b["out_i"] = t.full((r, k), 7777, dtype=t.int32, device=dev)
        b["out_s"] = t.full((r, k), float("nan"), dtype=t.float32, device=dev)
        b["lengths"] = t.zeros(r, dtype=t.int32, device=dev)
        b["aw"] = t.zeros(1, dtype=t.int32, device=dev)
        b["table"] = t.zeros((r, self.width), dtype=t.int32, device=dev)

    def set_lengths(self, lengths, active_width=None, table=None):
        t = self.torch
        self.buf["lengths"].copy_(t.tensor(lengths, dtype=t.int32))
        aw = max([*lengths, 0]) if active_width is None else active_width
        self.buf["aw"].fill_(aw)
        if table is not None:
            self.buf["table"].copy_(table)

    def _params(self, chunk: int, stage_cap: int) -> bytes:
        b = self.buf
        ptr = [
            b["logits"].data_ptr(),
            b["lengths"].data_ptr(),
            b["aw"].data_ptr(),
            b["table"].data_ptr(),
            b["carry_v"].data_ptr(),
            b["carry_i"].data_ptr(),
            b["part_v"].data_ptr(),
            b["part_i"].data_ptr(),
            b["out_i"].data_ptr(),
            b["out_s"].data_ptr() if self.scores else 0,
            self.supertile,  # logits_row_stride
            self.width,  # pt_row_stride
            self.rows * self.topk,  # carry_half_stride
        ]
        u32 = [
            self.rows,
            self.width,
            self.topk,
            chunk,
            self.chunks,
            self.supertile,
            self.slices,
            self.slen,
            int(self.physical),
        ]
        if self.kern.module == "old":
            return struct.pack("<13Q10I", *ptr, *u32, 0)
        pages = 1 << 31  # the K cache's page count as the launcher caps it
        hits = self.kern.hits(self.topk) if stage_cap else 0
        return struct.pack("<13Q12I", *ptr, *u32, pages, stage_cap, hits)

    def _go(self, fn: str, raw: bool, grid, chunk: int, cap: int, stream: int) -> None:
        old = self.kern.module == "old"
        smem = 0 if old else staged_bytes(raw, self.kern.hits(self.topk) if cap else 0, cap)
        params = self._params(chunk, cap)
        self.drv.launch(self.fns[fn], grid, (1024, 1, 1), smem, stream, params)

    def launch_chunk(self, chunk: int, stream: int) -> None:
        k, s, kern = self.topk, self.supertile, self.kern
        if kern.empty:
            self._go("topkx_empty", True, (self.rows, 1, 1), chunk, 0, stream)
            return
        if self.slices == 1:
            self._go(kern.fold, kern.fold_raw, (self.rows, 1, 1), chunk, k + s, stream)
            return
        # slice and merge run the general paths only (no stage), as the launcher does
        grid = (self.rows, self.slices, 1)
        self._go(kern.slice, kern.slice_raw, grid, chunk, 0, stream)
        self._go(kern.merge, kern.merge_raw, (self.rows, 1, 1), chunk, 0, stream)

    def run_chunks(self, logits) -> None:
        """The whole call on full-width logits [rows, >= width*64]: per chunk, the
        chunk's live logits into the scratch (poison past them), then the top-k."""
        t = self.torch
        lengths = self.buf["lengths"].tolist()
        aw = int(self.buf["aw"].item())
        stream = t.cuda.current_stream().cuda_stream
        for c in range(self.chunks):
            c0 = c * self.supertile
            sc = self.buf["logits"]
            sc.fill_(POISON)
            for r in range(self.rows):
                live = max(0, min(lengths[r], aw, self.width * PAGE))
                n = max(0, min(live - c0, self.supertile))
                if n > 0:
                    sc[r, :n].copy_(logits[r, c0 : c0 + n])
            self.launch_chunk(c, stream)
        t.cuda.synchronize()


# --------------------------------------------------------------------------- reference


def reference_positions(torch, logits, lengths, aw, width, topk):
    """Exact top-k positions per row ([rows, topk], -1 padded, ascending)."""
    rows, n = logits.shape
    bits = logits.view(torch.int32).long() & 0xFFFFFFFF
    x = logits + 0.0  # -0 -> +0
    xb = x.view(torch.int32).long() & 0xFFFFFFFF
    key = torch.where(xb >= 0x80000000, xb ^ 0xFFFFFFFF, xb | 0x80000000)
    key = torch.where(torch.isnan(logits), torch.zeros_like(key), key)
    pos = torch.arange(n, device=logits.device)
    live = torch.tensor([max(0, min(ln, aw, width * PAGE)) for ln in lengths], device=logits.device)
    ok = (pos[None, :] < live[:, None]) & (bits != 0xFFFFFFFF)
    comp = key * (1 << 31) + ((1 << 31) - 1 - pos[None, :])
    comp = torch.where(ok, comp, torch.full_like(comp, -1))
    k = min(topk, n)
    vals, idx = torch.topk(comp, k, dim=1)
    idx = torch.where(vals >= 0, idx, torch.full_like(idx, -1))
    out = torch.full((rows, topk), -1, dtype=torch.long, device=logits.device)
    out[:, :k] = idx
    return torch.sort(out, dim=1).values


def compare(torch, st: Stage, logits, lengths, aw, name: str, ref=None) -> dict:
    if ref is None:
        ref = reference_positions(torch, logits, lengths, aw, st.width, st.topk)
    out = st.buf["out_i"].long()
    if st.physical:
        table = st.buf["table"].long()
        valid = ref >= 0
        pid = table.gather(1, (ref.clamp(min=0) // PAGE))
        phys = torch.where(pid >= 0, pid * PAGE + ref.clamp(min=0) % PAGE, -1)
        ref_cmp = torch.sort(torch.where(valid, phys, -1), dim=1).values
    else:
        ref_cmp = ref
    got = torch.sort(out, dim=1).values
    bad_rows = (got != ref_cmp).any(dim=1)
    res = {
        "check": name,
        "kernels": st.kern.name,
        "rows": st.rows,
        "topk": st.topk,
        "supertile": st.supertile,
        "slices": st.slices,
        "chunks": st.chunks,
        "bad_rows": int(bad_rows.sum()),
    }
    if st.scores and not st.physical:
        # scores of the kernel's own slots: the logits' bits (or -inf for -1)
        o = st.buf["out_i"].long()
        g = logits.gather(1, o.clamp(min=0))
        want = torch.where(o >= 0, g, torch.full_like(g, -math.inf))
        have = st.buf["out_s"]
        res["bad_scores"] = int((want.view(torch.int32) != have.view(torch.int32)).sum())
    if res["bad_rows"]:
        r = int(bad_rows.nonzero()[0])
        missing = sorted(set(ref_cmp[r].tolist()) - set(got[r].tolist()))[:8]
        extra = sorted(set(got[r].tolist()) - set(ref_cmp[r].tolist()))[:8]
        res["first_bad_row"] = r
        res["missing"] = missing
        res["extra"] = extra
    res["ok"] = res["bad_rows"] == 0 and res.get("bad_scores", 0) == 0
    return res


# --------------------------------------------------------------------------- checks


def adversarial_logits(torch, rows, n, kind, g):
    dev = "cuda"
    x = torch.randn(rows, n, device=dev, generator=g) * 15
    if kind == "normal":
        return x
    if kind == "ties":  # few distinct values: huge ties at every level
        return torch.round(x / 8) * 8
    if kind == "equal":
        return torch.full((rows, n), 1.5, device=dev)
    if kind == "zeros":  # +0 and -0 only, with a few numbers above
        z = torch.where(torch.rand(rows, n, device=dev, generator=g) < 0.5, 0.0, -0.0)
        z[:, ::97] = 1.0
        return z
    if kind == "negative":
        return -x.abs() - 1.0
    if kind == "special":  # NaN (both signs), +-inf, unmapped pages, subnormals, huge
        y = x.clone()
        m = torch.rand(rows, n, device=dev, generator=g)
        y[m < 0.01] = float("nan")
        yi = y.view(torch.int32)
        neg_nan = (m >= 0.01) & (m < 0.02)
        yi[neg_nan] = -4194304  # 0xffc00000, a negative NaN
        y[(m >= 0.02) & (m < 0.021)] = float("inf")
        y[(m >= 0.021) & (m < 0.03)] = -float("inf")
        y[(m >= 0.03) & (m < 0.04)] = 1e-40
        y[(m >= 0.04) & (m < 0.041)] = 3.0e38
        return y
    if kind == "unmapped":  # whole pages of IDX_NOT_CANDIDATE_BITS
        y = x.clone()
        pages = torch.rand(rows, (n + PAGE - 1) // PAGE, device=dev, generator=g) < 0.4
        mask = pages.repeat_interleave(PAGE, dim=1)[:, :n]
        y.view(torch.int32)[mask] = NOT_CANDIDATE
        return y
    if kind == "nan_heavy":  # fewer numbers than topk: NaNs get selected
        y = torch.full((rows, n), float("nan"), device=dev)
        y[:, ::300] = x[:, ::300]
        return y
    raise ValueError(kind)


def run_checks(torch, drv, fns, kernel_sets, log, small=False) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(7)
    results = []
    # (rows, width pages, lengths, topk, supertile, slices, kind, physical)
    L = 625  # 40000 tokens: 5 chunks of 8192, partial last page
    cases = [
        (4, 512, [32768, 32768, 20000, 32000], 512, 32768, 1, "normal", False),
        (4, 512, [32768, 32768, 20000, 32000], 1024, 32768, 1, "normal", False),
        (4, 512, [32768, 32768, 20000, 32000], 2048, 32768, 1, "normal", False),
        (8, 40, [0, 1, 300, 511, 512, 513, 2000, 2560], 512, 1024, 1, "normal", False),
        (4, L, [40000, 39999, 17000, 8193], 512, 8192, 1, "normal", False),
        (4, L, [40000, 39999, 17000, 8193], 2048, 8192, 1, "normal", False),
        (4, L, [40000, 39999, 17000, 8193], 512, 16384, 2, "normal", False),
        (2, 2048, [131072, 100000], 512, 131072, 16, "normal", False),
        (2, 2048, [131072, 100000], 512, 131072, 4, "normal", False),
        (2, 2048, [131072, 100000], 2048, 131072, 8, "normal", False),
        (4, 512, [32768, 32768, 1500, 30000], 512, 32768, 1, "ties", False),
        (4, L, [40000, 39999, 17000, 8193], 512, 8192, 1, "ties", False),
        (2, 2048, [131072, 100000], 512, 131072, 16, "ties", False),
        (2, 40, [2560, 1500], 512, 1024, 1, "equal", False),
        (2, 512, [32768, 30000], 512, 32768, 1, "equal", False),
        (2, 512, [32768, 30000], 512, 32768, 4, "equal", False),
        (3, 512, [32768, 30000, 5000], 512, 32768, 1, "zeros", False),
        (3, 512, [32768, 30000, 5000], 512, 8192, 1, "negative", False),
        (3, 512, [32768, 30000, 5000], 512, 32768, 1, "special", False),
        (3, 512, [32768, 30000, 5000], 512, 16384, 2, "special", False),
        (3, 512, [32768, 30000, 5000], 512, 32768, 1, "unmapped", False),
        (3, 512, [32768, 30000, 5000], 1024, 8192, 1, "unmapped", False),
        (3, 512, [32768, 30000, 5000], 512, 32768, 1, "nan_heavy", False),
        (4, 512, [32768, 32768, 20000, 100], 512, 32768, 1, "normal", True),
        (4, L, [40000, 39999, 17000, 8193], 512, 8192, 1, "normal", True),
        (2, 2048, [131072, 100000], 512, 131072, 16, "normal", True),
    ]
    if small:  # for compute-sanitizer: one case per path, short rows
        cases = [
            (3, 40, [2560, 1500, 100], 512, 1024, 1, "normal", False),
            (3, 40, [2560, 1500, 100], 512, 1024, 1, "ties", False),
            (2, 64, [4096, 3000], 512, 4096, 2, "normal", True),
            (2, 64, [4096, 3000], 512, 2048, 1, "special", False),
        ]
    # every kernel set sees the same rows; the reference is computed once per case
    for rows, width, lengths, topk, st, sl, kind, phys in cases:
        logits = adversarial_logits(torch, rows, width * PAGE, kind, g)
        table = None
        if phys:
            table = torch.randperm(rows * width + 50, device="cuda", generator=g)
            table = table[: rows * width].reshape(rows, width).int()
            table[0, 3] = -1  # an unmapped page (its logits are not candidates)
            logits.view(torch.int32)[0, 3 * PAGE : 4 * PAGE] = NOT_CANDIDATE
        ref = reference_positions(torch, logits, lengths, max(lengths), width, topk)
        for kern in kernel_sets:
            stage = Stage(
                torch, drv, fns[kern.module], kern, rows, width, topk, st, sl, physical=phys
            )
            stage.set_lengths(lengths, table=table)
            stage.run_chunks(logits)
            res = compare(torch, stage, logits, lengths, max(lengths), f"{kind}", ref=ref)
            res["physical"] = phys
            # determinism of the selected set: run again, same answer
            first = torch.sort(stage.buf["out_i"], dim=1).values.clone()
            stage.run_chunks(logits)
            res["repeat_same"] = bool((torch.sort(stage.buf["out_i"], dim=1).values == first).all())
            res["ok"] = res["ok"] and res["repeat_same"]
            results.append(res)
            msg = "ok" if res["ok"] else "FAIL " + json.dumps(res)
            log(
                f"check {kern.name:16s} {kind:10s} rows={rows} topk={topk} st={st} "
                f"slices={sl} phys={int(phys)}: {msg}"
            )
            del stage
    return results


# --------------------------------------------------------------------------- timing


@dataclass(frozen=True)
class Case:
    name: str
    rows: int
    context: int
    prefill: bool
    heads: int = 64
    topk: int = 512

    @property
    def width(self) -> int:
        return self.context // PAGE

    def lengths(self) -> list[int]:
        if self.prefill:
            return [self.context - self.rows + 1 + i for i in range(self.rows)]
        return [self.context] * self.rows


CASES = [
    Case("decode_r64_L32768", 64, 32768, prefill=False),
    Case("decode_r1_L131072", 1, 131072, prefill=False),
    Case("prefill_r4096_L32768", 4096, 32768, prefill=True),
]


def b12x_logits(torch, case: Case):
    """The logits b12x's own scorer writes for `b12x bench indexer`'s inputs
    (its scratch region after one call), or None without b12x."""
    try:
        from b12x.attention import dsa_indexer as di
        from b12x.bench.indexer import CASES as BENCH_CASES
        from b12x.bench.indexer import bind_case, case_caps, make_inputs
    except ImportError:
        return None
    bench_case = BENCH_CASES[case.name]
    plan = di.plan(case_caps(bench_case, device="cuda:0"))
    if plan.max_chunks != 1:
        return None
    scratch = torch.empty((plan.nbytes,), dtype=torch.uint8, device="cuda")
    idx = torch.empty((case.rows, case.topk), dtype=torch.int32, device="cuda")
    b = bind_case(plan, make_inputs(bench_case), scratch, idx)
    di.run(b)
    torch.cuda.synchronize()
    return di.scratch_views(b)["logits"][: case.rows].clone()


def bench_logits(torch, case: Case):
    """fp32 logits of b12x.bench.indexer.make_inputs (same generator and draws),
    scored with exact fp32 products and sums: relu(q.k) * w summed over heads,
    times the token's scale."""
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(1234)
    rows, heads, width = case.rows, case.heads, case.width
    table_rows = 1 if case.prefill else rows
    n_pages = table_rows * width
    q = (torch.randn(rows, heads, 128, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(rows, heads, device=dev, generator=g) * heads**-0.5
    k = (torch.randn(n_pages, PAGE, 128, device=dev, generator=g) * 2).to(torch.float8_e4m3fn)
    scales = torch.rand(n_pages, PAGE, device=dev, generator=g) + 0.05
    table = torch.randperm(n_pages, device=dev, generator=g).reshape(table_rows, width)
    qf = q.float()
    out = torch.empty(rows, width * PAGE, device=dev)
    block = 64
    for r0 in range(0, rows, block):
        r1 = min(rows, r0 + block)
        tb = table[0] if case.prefill else table[r0:r1]
        kf = k[tb].float().reshape(-1 if case.prefill else r1 - r0, width * PAGE, 128)
        sf = scales[tb].reshape(1 if case.prefill else r1 - r0, width * PAGE)
        if case.prefill:
            dots = torch.matmul(qf[r0:r1], kf[0].t())  # [b, heads, T]
        else:
            dots = torch.matmul(qf[r0:r1], kf.transpose(1, 2))
        out[r0:r1] = (torch.relu(dots) * w[r0:r1, :, None]).sum(1) * sf
    return out


def time_graph_us(torch, fn, iters: int, flush) -> list[float]:
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        flush.add_(1)
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends, strict=True)]


def median(xs):
    ys = sorted(xs)
    n = len(ys)
    return ys[n // 2] if n % 2 else 0.5 * (ys[n // 2 - 1] + ys[n // 2])


def run_timings(
    torch,
    drv,
    fns,
    arms_by_case,
    iters,
    log,
    only=(),
    profile=False,
    use_b12x=False,
    on_case=None,
) -> list[dict]:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    flush = torch.zeros(2 * l2 // 4 + 1, dtype=torch.float32, device="cuda")
    results = []
    for case in CASES:
        if only and case.name not in only:
            continue
        t0 = time.time()
        logits = b12x_logits(torch, case) if use_b12x else None
        source = "b12x scorer"
        if logits is None:
            logits, source = bench_logits(torch, case), "torch fp32 scoring"
        lengths = case.lengths()
        ref = reference_positions(torch, logits, lengths, max(lengths), case.width, case.topk)
        log(f"{case.name}: logits ({source}) ready in {time.time() - t0:.1f} s")
        for arm, kern, slices in arms_by_case[case.name]:
            st = Stage(
                torch,
                drv,
                fns[kern.module],
                kern,
                case.rows,
                case.width,
                case.topk,
                case.context,
                slices,
                scores=True,
            )
            st.set_lengths(lengths)
            st.run_chunks(logits)  # fills the scratch chunk (one chunk) and runs once
            chk = compare(torch, st, logits, lengths, max(lengths), "bench", ref=ref)
            if profile:
                log(f"  {arm:28s} profiled  check={'ok' if chk['ok'] else 'FAIL'}")
                continue

            def call(st=st):
                st.launch_chunk(0, torch.cuda.current_stream().cuda_stream)

            samples = time_graph_us(torch, call, iters, flush)
            res = {
                "case": case.name,
                "arm": arm,
                "median_us": median(samples),
                "samples_us": samples,
                "slices": slices,
                "hit_cap": kern.hits(case.topk),
                "logits": source,
                "check_ok": chk["ok"],
                "check_bad_rows": chk["bad_rows"],
            }
            results.append(res)
            log(f"  {arm:28s} {res['median_us']:9.1f} us  check={'ok' if chk['ok'] else 'FAIL'}")
        if profile:
            continue
        masked = logits.clone()
        pos = torch.arange(logits.shape[1], device="cuda")
        lens = torch.tensor(lengths, device="cuda")
        masked[pos[None, :] >= lens[:, None]] = -math.inf
        samples = time_graph_us(
            torch, lambda m=masked, k=case.topk: torch.topk(m, k, dim=1), max(5, iters // 3), flush
        )
        results.append(
            {
                "case": case.name,
                "arm": "torch.topk",
                "median_us": median(samples),
                "samples_us": samples,
                "logits": source,
            }
        )
        log(f"  {'torch.topk':28s} {median(samples):9.1f} us")
        del logits, masked, ref
        torch.cuda.empty_cache()
        if on_case is not None:
            on_case(results)
    return results


# --------------------------------------------------------------------------- summary


def summary(args: argparse.Namespace) -> int:
    """One table of every OUT/*.json this harness wrote: median us per arm x case,
    the exact checks' counts, and each arm's check on the bench logits."""
    checks, results = [], []
    for f in sorted(Path(args.out).glob("*.json")):
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or "results" not in doc:
            continue
        checks += doc.get("checks", [])
        results += doc["results"]
    cases = [c.name for c in CASES]
    med, ok = {}, {}
    for r in results:
        med[(r["arm"], r["case"])] = r["median_us"]
        if "check_ok" in r:
            ok[(r["arm"], r["case"])] = r["check_ok"]
    arms = list(dict.fromkeys(r["arm"] for r in results))
    short = {c: c.split("_")[0] + "_" + c.split("_")[1] for c in cases}
    print(f"{'arm (median us)':28s}" + "".join(f"{short[c]:>16s}" for c in cases))
    for a in arms:
        cells = []
        for c in cases:
            v = med.get((a, c))
            flag = "" if ok.get((a, c), True) else " BAD"
            cells.append(f"{'-' if v is None else f'{v:.1f}'}{flag:>4s}".rjust(16))
        print(f"{a:28s}" + "".join(cells))
    n_bad = sum(not c["ok"] for c in checks)
    bench_bad = sum(not v for v in ok.values())
    print(
        f"exact checks: {len(checks) - n_bad} passed, {n_bad} failed; "
        f"bench-logits checks: {len(ok) - bench_bad} passed, {bench_bad} failed"
    )
    for c in checks:
        if not c["ok"]:
            print("  FAILED", json.dumps(c)[:300])
    return 1 if n_bad or bench_bad else 0


# --------------------------------------------------------------------------- main


def run(args: argparse.Namespace) -> int:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device="cuda")  # the primary context, current on this thread
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []

    def log(msg):
        print(msg, flush=True)
        lines.append(msg)

    drv = Driver()
    d = Path(args.dir)
    fns, attrs = {}, {}
    t0 = time.time()
    opt_in = drv.shared_opt_in()
    for module in ("new", "old"):
        path = d / f"topk_{module}.cubin"  # built with ptxas for the device when present
        if not path.exists():
            path = d / f"topk_{module}.ptx"  # else JIT-compiled by the driver
        if not path.exists():
            continue
        mod = drv.load(path.read_bytes())
        names = ["b12x_indexer_topk_fold", "b12x_indexer_topk_slice", "b12x_indexer_topk_merge"]
        if module == "new":
            names += ["b12x_indexer_topk_fold_prefix", *EXPERIMENT_KERNELS]
        fns[module] = {}
        for n in names:
            f = drv.function(mod, n)
            if module == "new":
                drv.allow_shared(f, opt_in)
            fns[module][n] = f
            # NUM_REGS = 4, LOCAL_SIZE_BYTES = 3
            attrs[f"{module}:{n}"] = {"regs": drv.attr(f, 4), "local_bytes": drv.attr(f, 3)}
    log(f"modules loaded in {time.time() - t0:.1f} s: {json.dumps(attrs)}")

    fold_p = "b12x_indexer_topk_fold_prefix"
    fold_pb1 = "topkx_fold_prefix_u4_b1"  # prefix stage with one CTA per SM (experiment)

    raw = Kernels("b12x", "new")  # the launcher's fold for rows <= SMs, and slice + merge
    prefix = Kernels("b12x_prefix", "new", fold=fold_p, fold_raw=False)  # for more rows
    prefix_b1 = Kernels("b12x_prefix_b1", "new", fold=fold_pb1, fold_raw=False)
    hit1k = Kernels("b12x_hit1k", "new", hit_cap=1024)  # a short list: fallbacks exercised
    empty = Kernels("empty", "new", empty=True)
    old = Kernels("old", "old")
    have_old = "old" in fns

    checks = []
    if not args.no_checks:
        check_sets = [raw, prefix] if args.small else [raw, prefix, hit1k]
        checks = run_checks(torch, drv, fns, check_sets, log, small=args.small)
    n_bad = sum(not c["ok"] for c in checks)
    log(f"checks: {len(checks) - n_bad} passed, {n_bad} failed")

    arms = {
        "decode_r64_L32768": [
            ("empty_kernel", empty, 1),
            ("b12x", raw, 1),
            ("b12x_prefix_b1", prefix_b1, 1),
        ],
        "decode_r1_L131072": [("b12x_slices16", raw, 16)],
        "prefill_r4096_L32768": [("b12x", prefix, 1), ("b12x_raw", raw, 1)],
    }
    if have_old:
        arms["decode_r64_L32768"].append(("b12x_old", old, 1))
        arms["decode_r1_L131072"].append(("b12x_old_slices16", old, 16))
        arms["prefill_r4096_L32768"].append(("b12x_old", old, 1))
    if args.arms:
        arms = {c: [a for a in v if a[0] in args.arms] for c, v in arms.items()}
    if args.profile:  # one eager call of each product arm, for ncu
        keep = {"b12x", "b12x_slices16"}
        arms = {c: [a for a in v if a[0] in keep] for c, v in arms.items()}

    meta = {
        "what": "top-k stage alone (tools/gpu/topk_bench.py)",
        "device": torch.cuda.get_device_name(0),
        "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "timing": "CUDA graph replay; before every replay a 2x-L2 buffer is rewritten "
        "outside the timed events; medians of all samples",
        "iters": args.iters,
        "kernel_attrs": attrs,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }

    def write(timings):
        doc = {"meta": meta, "checks": checks, "results": timings, "log": lines}
        (out / args.json).write_text(json.dumps(doc, indent=1))

    write([])
    timings = []
    if not args.no_timing:
        timings = run_timings(
            torch,
            drv,
            fns,
            arms,
            args.iters,
            log,
            only=args.cases,
            profile=args.profile,
            use_b12x=args.b12x_logits,
            on_case=write,
        )

    write(timings)
    print(f"wrote {out / args.json}")
    return 1 if n_bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build")
    b.add_argument("dir")
    b.add_argument("--old", help="an earlier kernels/indexer_topk.cu to compare with")
    r = sub.add_parser("run")
    r.add_argument("dir")
    r.add_argument("--out", required=True)
    r.add_argument("--json", default="topk.json")
    r.add_argument("--iters", type=int, default=30)
    r.add_argument("--no-checks", action="store_true")
    r.add_argument("--no-timing", action="store_true")
    r.add_argument("--b12x-logits", action="store_true", help="time on b12x's scorer logits")
    r.add_argument("--profile", action="store_true", help="one eager call per product arm")
    r.add_argument("--small", action="store_true", help="a few short checks (for the sanitizers)")
    r.add_argument("--cases", nargs="*", default=[], help="timing cases (default: all)")
    r.add_argument("--arms", nargs="*", default=[], help="timing arms (default: all)")
    b.add_argument("--ptxas", help="ptxas (CUDA 12.8) to also write sm_90 cubins")
    sm = sub.add_parser("summary")
    sm.add_argument("out")
    args = ap.parse_args()
    if args.cmd == "summary":
        return summary(args)
    return build(args) if args.cmd == "build" else run(args)


if __name__ == "__main__":
    sys.exit(main())
