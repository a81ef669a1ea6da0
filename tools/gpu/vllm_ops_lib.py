#!/usr/bin/env python3
"""vLLM's own compiled op library, carried to a GPU host in parts.

``vllm/_C_stable_libtorch.abi3.so`` (92 MB) holds every ``torch.ops._C`` op of
vLLM 0.33: the Hopper top-k kernels the stock indexer path runs
(``top_k_per_row_*``, ``persistent_topk``), and the capability queries that
vLLM's modules call at import (``cutlass_scaled_mm_supports_block_fp8`` in
``w8a8_utils``). Its CUDA code does not compress (xz -9: 64 MB), which is the
whole of the device tool's 64 MiB limit on one call; so it travels as numbered
parts, each small enough to ride beside what a call already carries, and the
host joins them when every part has arrived (a warm machine keeps what earlier
calls carried).

Here:          tools/gpu/vllm_ops_lib.py pack [--part-mib N]   -> .device/vllm-ops/
On the host:   tools/gpu/vllm_ops_lib.py install [--site DIR]   (vllm_bundle.py install calls it)

``install`` joins the parts, checks the sha256 of the whole, writes the library
into the site's ``vllm/`` and loads it once in a child python3 (``torch.ops.load_library``);
if a part is missing or the library does not load against the host's torch,
it says so and leaves the library out (vllm_bundle.py then writes its stand-in).
"""

from __future__ import annotations

import argparse
import hashlib
import lzma
import subprocess
import sys
from pathlib import Path

import carry

OPS_DIR = carry.DEVICE_DIR / "vllm-ops"
MANIFEST = OPS_DIR / "vllm_ops.json"
MODULE = "_C_stable_libtorch"  # vllm.<MODULE>
LIBRARY = f"{MODULE}.abi3.so"
# the first part rides beside the vLLM bundle, the DeepGEMM peer, the b12x
# wheel and the tracked files; the second (the rest, 46.7 MiB) fills a call alone
DEFAULT_PART_MIB = (14,)


def part_name(i: int) -> str:
    return f"part-{i:02d}.xz"


def split(data: bytes, sizes_mib: tuple[int, ...]) -> list[bytes]:
    """``data`` cut into consecutive parts of the given sizes, then one with the rest."""
    parts, start = [], 0
    for mib in sizes_mib:
        end = min(len(data), start + mib * 2**20)
        parts.append(data[start:end])
        start = end
    parts.append(data[start:])
    return [p for p in parts if p]


def cmd_pack(args: argparse.Namespace) -> int:
    site = carry.site_packages(Path(args.venv))
    lib = site / "vllm" / LIBRARY
    if not lib.is_file():
        raise SystemExit(f"vllm_ops_lib: {lib} expected (the tests' vLLM), not found")
    raw = lib.read_bytes()
    print(f"vllm_ops_lib: compressing {lib} ({carry.mib(len(raw))}) with xz -9")
    packed = lzma.compress(raw, preset=carry.XZ_PRESET)
    OPS_DIR.mkdir(parents=True, exist_ok=True)
    for old in OPS_DIR.glob("part-*.xz"):
        old.unlink()
    parts = split(packed, tuple(args.part_mib))
    entries = []
    for i, blob in enumerate(parts):
        path = OPS_DIR / part_name(i)
        path.write_bytes(blob)
        entries.append({"file": path.name, "bytes": len(blob)})
        print(f"  {path.relative_to(carry.REPO)}  {carry.mib(len(blob))}")
    carry.write_manifest(
        MANIFEST,
        {
            "library": f"vllm/{LIBRARY}",
            "raw_bytes": len(raw),
            "raw_sha256": hashlib.sha256(raw).hexdigest(),
            "xz_sha256": hashlib.sha256(packed).hexdigest(),
            "parts": entries,
        },
    )
    return 0


def join_parts(manifest: dict[str, object], where: Path) -> tuple[bytes | None, str]:
    """The library's bytes from its parts, or None and why not."""
    entries = list(manifest["parts"])  # type: ignore[call-overload]
    missing = [e["file"] for e in entries if not (where / e["file"]).is_file()]
    if missing:
        return None, f"parts not carried (yet): {', '.join(missing)}"
    packed = b"".join((where / e["file"]).read_bytes() for e in entries)
    if hashlib.sha256(packed).hexdigest() != manifest["xz_sha256"]:
        return None, "the joined parts do not match the recorded sha256"
    raw = lzma.decompress(packed)
    if hashlib.sha256(raw).hexdigest() != manifest["raw_sha256"]:
        return None, "the library does not match the recorded sha256"
    return raw, ""


def loads(path: Path) -> str:
    """'' when ``path`` loads into the host's torch (in a child process), else why not."""
    probe = f"import torch; torch.ops.load_library({str(path)!r})"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["?"])[-1]


def install(site: Path, where: Path | None = None) -> str:
    """Puts the real library into ``site``'s vLLM from the parts in ``where``
    (default :data:`OPS_DIR`); '' when it is there and loads, else why it is
    not (nothing is left behind then). A stamp of its sha256, written last,
    says an earlier install of the same library finished (as carry's
    unpack_once does for the bundles): then nothing is read again."""
    where = OPS_DIR if where is None else where
    if not (where / MANIFEST.name).is_file():
        return f"{where / MANIFEST.name} not carried"
    manifest = carry.read_manifest(where / MANIFEST.name)
    target = site / str(manifest["library"])
    stamp = site / ".vllm_ops.sha256"
    sha = str(manifest["raw_sha256"])
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == sha:
        return ""
    # another or a half-written library must not shadow the stand-in
    target.unlink(missing_ok=True)
    stamp.unlink(missing_ok=True)
    raw, why = join_parts(manifest, where)
    if raw is None:
        return why
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(raw)
    why = loads(target)
    if why:
        target.unlink()
        return f"{target.name} does not load into this torch: {why}"
    stamp.write_text(sha + "\n")
    return ""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("pack", help="here: compress and cut the library into parts")
    b.add_argument("--venv", default=str(carry.REPO / ".venv"), help="the tests' venv")
    b.add_argument("--part-mib", type=int, nargs="+", default=list(DEFAULT_PART_MIB),
                   help="sizes of the parts but the last, which takes the rest")  # fmt: skip
    i = sub.add_parser("install", help="on the GPU host: join, check and load the library")
    i.add_argument("--site", default=str(carry.SITE))
    args = p.parse_args(argv)
    if args.cmd == "pack":
        return cmd_pack(args)
    why = install(Path(args.site))
    print(f"vllm_ops_lib: {'vLLM ' + LIBRARY + ' installed and loads' if not why else why}")
    return 0 if not why else 1


if __name__ == "__main__":
    sys.exit(main())
