#!/usr/bin/env python3
"""The DeepGEMM peer of ``b12x bench indexer``, carried to a GPU host.

vLLM 0.33's wheel ships DeepGEMM as ``vllm/third_party/deep_gemm`` (its
``TORCH_LIBRARY`` extension, its Python wrappers and the CUDA headers its JIT
compiles against, about 57 MB; about 6 MB as xz). The package imports itself
relatively, so on the host it imports as plain ``deep_gemm``, which is the
name vLLM looks for first.

Here (the tests' venv has vLLM):
    tools/gpu/deepgemm_peer.py pack [--venv .venv] [--dry-run]
        -> .device/deepgemm/deep_gemm-<version>.tar.xz and deep_gemm.json
On the GPU host:
    tools/gpu/deepgemm_peer.py unpack [--check]
        -> .device/site/deep_gemm (tools/gpu/site.sh puts .device/site on PYTHONPATH)

DeepGEMM compiles its kernels at first use with the host's nvcc: CUDA_HOME must
name a CUDA toolkit (site.sh sets it from ``nvcc`` on PATH) and DG_JIT_CACHE_DIR
says where the compiled kernels go (site.sh: .device/deepgemm-jit).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import carry

BUNDLE_DIR = carry.DEVICE_DIR / "deepgemm"
MANIFEST = BUNDLE_DIR / "deep_gemm.json"
PACKAGE = "vllm/third_party/deep_gemm"


def package_dir(venv: Path) -> Path:
    path = carry.site_packages(venv) / PACKAGE
    if not (path / "__init__.py").is_file():
        raise SystemExit(f"deepgemm_peer: {path} expected (vLLM's DeepGEMM), not found")
    return path


def version_of(package: Path) -> str:
    """``__version__`` from the package's ``__init__.py``, read without importing it."""
    text = (package / "__init__.py").read_text()
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.M)
    return match.group(1) if match else "unknown"


def members(package: Path) -> list[carry.Member]:
    """Every file of the package (extension, wrappers, headers), no bytecode."""
    return list(carry.walk(package, "deep_gemm", lambda rel: False))


def cmd_pack(args: argparse.Namespace) -> int:
    package = package_dir(Path(args.venv))
    files = members(package)
    version = version_of(package)
    raw = sum(m.size for m in files)
    extensions = [m.arcname for m in files if m.arcname.endswith(".so")]
    print(f"deepgemm_peer: {package}: DeepGEMM {version}, {len(files)} files, {carry.mib(raw)}")
    print(f"  extension: {', '.join(extensions) or 'NONE (the JIT needs it)'}")
    if args.dry_run:
        return 0
    archive = BUNDLE_DIR / f"deep_gemm-{version}.tar.xz"
    entry = carry.pack(files, archive)
    carry.write_manifest(
        MANIFEST,
        {"what": "vLLM's DeepGEMM, imported as deep_gemm", "version": version,
         "source": str(package), "raw_bytes": raw, "archive": entry},
    )  # fmt: skip
    print(f"  wrote {archive} ({carry.mib(int(entry['bytes']))}) and {MANIFEST.name}")
    return 0


def cmd_unpack(args: argparse.Namespace) -> int:
    manifest = carry.read_manifest(MANIFEST)
    entry = manifest["archive"]
    archive = carry.check_archive(BUNDLE_DIR, entry)
    site = Path(args.site)
    if args.dry_run:
        print(f"deepgemm_peer: would unpack {archive} into {site}")
        return 0
    count = carry.unpack_once(archive, site, str(entry["sha256"]), "deep_gemm")
    done = "already there" if count is None else f"{count} files"
    print(f"deepgemm_peer: DeepGEMM {manifest['version']} in {site / 'deep_gemm'}: {done}")
    if args.check:
        probe = "import deep_gemm as d; print('deep_gemm', d.__version__, 'SMs', d.get_num_sms())"
        return subprocess.run([sys.executable, "-c", probe], env=_with_site(site)).returncode
    return 0


def _with_site(site: Path) -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pk = sub.add_parser("pack", help="here: pack vLLM's DeepGEMM into .device/deepgemm")
    pk.add_argument("--venv", default=str(carry.REPO / ".venv"), help="the tests' venv")
    pk.add_argument("--dry-run", action="store_true", help="say what would be packed")
    up = sub.add_parser("unpack", help="on the GPU host: unpack into the site folder")
    up.add_argument("--site", default=str(carry.SITE))
    up.add_argument("--check", action="store_true", help="import it afterwards (needs a GPU)")
    up.add_argument("--dry-run", action="store_true", help="say what would be unpacked")
    args = p.parse_args(argv)
    return cmd_pack(args) if args.cmd == "pack" else cmd_unpack(args)


if __name__ == "__main__":
    sys.exit(main())
