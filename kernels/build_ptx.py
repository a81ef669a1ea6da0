#!/usr/bin/env python3
"""Compile kernels/*.cu to the PTX that b12x-cuda embeds (rust/cuda/ptx/).

The compiler is pinned: NVRTC 12.8 from PyPI (nvidia-cuda-nvrtc-cu12==12.8.93)
with CUDA's headers from nvidia-cuda-runtime-cu12==12.8.90. NVRTC 12.8 emits
PTX ISA 8.7, which every driver from 570 on loads; the baseline target is
compute_89 (FP8 mma.sync), JIT-compiled by the driver for sm_90 and sm_120.
Arch-specific modules (ARCH_SPECIFIC) sit beside the baseline, never instead
of it: indexer_wgmma, indexer_hopper and indexer_select target compute_90a
(Hopper wgmma, TMA, thread block clusters) and load on sm_90 only.

    python kernels/build_ptx.py           # rewrite rust/cuda/ptx/*.ptx
    python kernels/build_ptx.py --check   # exit 1 if the committed PTX is stale
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_wgmma

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "kernels"
PTX_DIR = ROOT / "rust" / "cuda" / "ptx"
ARCH = "compute_89"
ARCH_SPECIFIC = {
    "indexer_wgmma": "compute_90a",
    "indexer_hopper": "compute_90a",
    "indexer_select": "compute_90a",
}
NVRTC_VERSION = (12, 8)
# -lineinfo stays off: it embeds absolute source paths, which would make the
# PTX depend on where the repository was cloned.
OPTIONS = ("--std=c++17", "-default-device", "--ftz=false")


def arch_of(module: str) -> str:
    return ARCH_SPECIFIC.get(module, ARCH)


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(
            f"build_ptx: Python package {name!r} not found; install "
            "nvidia-cuda-nvrtc-cu12==12.8.93 and nvidia-cuda-runtime-cu12==12.8.90"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def load_nvrtc() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(_package_dir("nvidia.cuda_nvrtc") / "lib" / "libnvrtc.so.12"))
    major, minor = ctypes.c_int(), ctypes.c_int()
    lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
    if (major.value, minor.value) != NVRTC_VERSION:
        sys.exit(f"build_ptx: NVRTC {major.value}.{minor.value} found, {NVRTC_VERSION} required")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib


def compile_one(nvrtc: ctypes.CDLL, source: Path, include_dirs: list[Path]) -> str:
    prog = ctypes.c_void_p()
    text = source.read_bytes()
    rc = nvrtc.nvrtcCreateProgram(ctypes.byref(prog), text, source.name.encode(), 0, None, None)
    if rc:
        sys.exit(f"build_ptx: nvrtcCreateProgram({source.name}) failed: {rc}")
    opts = [f"--gpu-architecture={arch_of(source.stem)}".encode()]
    opts += [o.encode() for o in OPTIONS] + [f"-I{d}".encode() for d in include_dirs]
    argv = (ctypes.c_char_p * len(opts))(*opts)
    rc = nvrtc.nvrtcCompileProgram(prog, len(opts), argv)
    log_size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(prog, ctypes.byref(log_size))
    log = ctypes.create_string_buffer(log_size.value)
    nvrtc.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit(
            f"build_ptx: {source.name} failed ({nvrtc.nvrtcGetErrorString(rc).decode()}):\n"
            f"{log.value.decode(errors='replace')}"
        )
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetPTXSize(prog, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(prog, ptx)
    nvrtc.nvrtcDestroyProgram(ctypes.byref(prog))
    return ptx.value.decode()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("only", nargs="*", help="module names (default: all kernels/*.cu)")
    args = parser.parse_args()

    # The generated wgmma headers are inputs of the PTX: refresh or check them first.
    if args.check and not gen_wgmma.is_fresh():
        for name in gen_wgmma.stale():
            print(f"stale: kernels/{name}; run: python kernels/build_ptx.py", file=sys.stderr)
        return 1
    if not args.check:
        gen_wgmma.write()
    nvrtc = load_nvrtc()
    include_dirs = [KERNELS, _package_dir("nvidia.cuda_runtime") / "include"]
    sources = sorted(KERNELS.glob("*.cu"))
    if args.only:
        sources = [s for s in sources if s.stem in args.only]
    stale = []
    for source in sources:
        ptx = compile_one(nvrtc, source, include_dirs)
        target = PTX_DIR / f"{source.stem}.ptx"
        if args.check:
            if not target.exists() or target.read_text() != ptx:
                stale.append(target.relative_to(ROOT))
        else:
            PTX_DIR.mkdir(parents=True, exist_ok=True)
            target.write_text(ptx)
            print(f"wrote {target.relative_to(ROOT)} ({len(ptx)} bytes)")
    if args.check:
        expected = {f"{s.stem}.ptx" for s in sorted(KERNELS.glob("*.cu"))}
        extra = sorted(p.name for p in PTX_DIR.glob("*.ptx") if p.name not in expected)
        if stale or extra:
            for path in stale:
                print(f"stale: {path} differs from a fresh build", file=sys.stderr)
            for name in extra:
                print(f"orphan: rust/cuda/ptx/{name} has no kernels/*.cu source", file=sys.stderr)
            print("run: python kernels/build_ptx.py", file=sys.stderr)
            return 1
        print(f"PTX up to date ({len(sources)} modules)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
