#!/usr/bin/env python3
"""vLLM 0.33's Python tree and the small packages it imports, carried to a GPU host.

vLLM's wheel is 336 MB, nearly all of it compiled libraries (flash-attention,
``_C_stable_libtorch``, DeepGEMM, ...). What ``tests/vllm_real`` runs of vLLM is
its Python code, so the bundle is:

* vLLM's installed tree, every file of the package and its dist-info except
  compiled code (the ``*.so`` libraries and the one ELF executable,
  ``vllm-rs``, the Rust frontend: 15 of the 23 MB this tarball would
  otherwise be), ``__pycache__`` and ``third_party/deep_gemm/include``
  (DeepGEMM travels whole as its own bundle: deepgemm_peer.py), as one xz
  tarball;
* cp312 manylinux wheels, at ``requirements-vllm.txt``'s pins, of the packages
  it imports that the GPU host's image does not have (the host's package list:
  ``--host-packages``, default the device notes' KINDS.md).

On the host ``install`` unpacks the tree into ``.device/site``, writes the
stand-in for the one compiled library vLLM's CUDA platform imports
unconditionally (:data:`STAND_INS`) and installs the wheels there with
``pip --target --no-deps --no-index``; tools/gpu/site.sh puts the folder on
PYTHONPATH, beside the b12x wheel installed in the host's python3.

Here:          tools/gpu/vllm_bundle.py build [--dry-run] [--wheel B12X_WHEEL]
On the host:   tools/gpu/vllm_bundle.py install [--dry-run]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import carry
import vllm_ops_lib

BUNDLE_DIR = carry.DEVICE_DIR / "vllm"
WHEELS = BUNDLE_DIR / "wheels"
MANIFEST = BUNDLE_DIR / "vllm_bundle.json"
REQUIREMENTS = carry.REPO / "requirements-vllm.txt"
HOST_PACKAGES = Path("/work/.library/device/KINDS.md")
# The H200 hosts' image: Python 3.12, glibc 2.39 (the platform string of their
# bench runs). llguidance 1.7.3 ships only manylinux_2_31 wheels, so the
# platform list goes up to the host's glibc rather than stopping at 2_28.
PYTHON = "3.12"
GLIBC = (2, 39)
# Left out of the tree: compiled code (by suffix, and any other ELF file: vLLM
# 0.33 has one, the vllm-rs frontend executable, which no tested module runs),
# bytecode, and DeepGEMM's JIT headers (29 MB; the DeepGEMM peer bundle
# carries them with its extension).
SKIPPED_SUFFIXES = (".so",)
SKIPPED_PREFIXES = ("third_party/deep_gemm/include/",)
ELF_MAGIC = b"\x7fELF"
# Compiled libraries that vLLM imports outside try/except ImportError: without
# them its CUDA platform, or the attention package every model imports, cannot
# load. Every other compiled library is imported inside try/except and is
# simply absent here. The op library travels for real where its parts were
# carried (vllm_ops_lib.py); its stand-in is written only when it did not.
OPS_LIBRARY = vllm_ops_lib.MODULE
STAND_INS = {
    OPS_LIBRARY: "vLLM's compiled op library (92 MB), imported by vllm/platforms/cuda.py",
    "vllm_flash_attn/_vllm_fa2_C": "flash-attention 2 (308 MB); vllm/vllm_flash_attn/__init__.py "
    "raises unless FA2 or FA3 imports, and vllm.model_executor.layers.attention imports it",
}
STAND_IN_SOURCE = '''"""Stand-in written by b12x's tools/gpu/vllm_bundle.py: {what}.

The real library was not carried to this host. This module registers no
ops: a vLLM op it would have provided is absent from torch.ops and fails
loudly when looked up; tools/gpu/vllm_ops_record.py lists the vLLM ops that
did run.
"""

B12X_STAND_IN = True
'''


# --- what goes in ------------------------------------------------------------------------------


def normalize(name: str) -> str:
    """A distribution name in its comparable form (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def read_pins(text: str) -> list[tuple[str, str]]:
    """``(name, version)`` of every ``name==version`` line (comments and blanks skipped)."""
    pins = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise SystemExit(f"vllm_bundle: line {number} expected 'name==version', got {raw!r}")
        pins.append((name.strip(), version.strip()))
    return pins


def read_host_packages(text: str) -> set[str]:
    """The host's package names: the ``Packages: a, b, ...`` sentence of the device
    notes (KINDS.md) where there is one, else the text as a comma or line list."""
    match = re.search(r"Packages:\s*(.+?)\.?\s*$", text, re.M)
    body = match.group(1) if match else text
    return {normalize(n) for n in re.split(r"[,\n]", body) if n.strip()}


def missing_pins(pins: Iterable[tuple[str, str]], host: set[str]) -> list[tuple[str, str]]:
    """The pins the host lacks, vLLM itself aside (it travels as its tree)."""
    return [(n, v) for n, v in pins if normalize(n) != "vllm" and normalize(n) not in host]


def manylinux_platforms(glibc: tuple[int, int]) -> list[str]:
    """Every manylinux tag a host with ``glibc`` runs, newest first (pip does not
    widen a ``--platform`` to older glibc versions by itself)."""
    major, minor = glibc
    tags = [f"manylinux_{major}_{m}_x86_64" for m in range(minor, 16, -1)]
    return [*tags, "manylinux2014_x86_64", "manylinux1_x86_64"]


def pip_download_command(
    pins: Iterable[tuple[str, str]], dest: Path, glibc: tuple[int, int]
) -> list[str]:
    cmd = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
        "--only-binary=:all:", "--python-version", PYTHON, "--implementation", "cp",
        "--dest", str(dest),
    ]  # fmt: skip
    for tag in manylinux_platforms(glibc):
        cmd += ["--platform", tag]
    return cmd + [f"{n}=={v}" for n, v in pins]


def is_compiled(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(len(ELF_MAGIC)) == ELF_MAGIC


def tree_members(
    site: Path, extra_skips: Iterable[str] = ()
) -> tuple[list[carry.Member], list[carry.Member]]:
    """vLLM's package and dist-info files, and the compiled files left out
    (besides the ``*.so``): what :data:`SKIPPED_SUFFIXES`,
    :data:`SKIPPED_PREFIXES` and ``extra_skips`` (paths under the package) name
    never travels, nor does any other ELF file."""
    package = site / "vllm"
    if not (package / "__init__.py").is_file():
        raise SystemExit(f"vllm_bundle: {package} expected (the tests' vLLM), not found")
    infos = sorted(site.glob("vllm-*.dist-info"))
    if len(infos) != 1:
        raise SystemExit(f"vllm_bundle: one vllm-*.dist-info expected in {site}, got {infos}")
    skips = (*SKIPPED_PREFIXES, *extra_skips)

    def skip(rel: str) -> bool:
        return rel.endswith(SKIPPED_SUFFIXES) or any(
            rel == s or rel.startswith(s.rstrip("/") + "/") for s in skips
        )

    files = [
        *carry.walk(package, "vllm", skip),
        *carry.walk(infos[0], infos[0].name, lambda rel: False),
    ]
    compiled = [m for m in files if is_compiled(m.path)]
    return [m for m in files if m not in compiled], compiled


def tracked_bytes() -> int:
    """Bytes of every file git tracks here: they travel with the working tree."""
    out = subprocess.run(
        ["git", "-C", str(carry.REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    return sum(
        (carry.REPO / name).stat().st_size
        for name in out.decode().split("\0")
        if name and (carry.REPO / name).is_file()
    )


# --- build (here) ------------------------------------------------------------------------------


def cmd_build(args: argparse.Namespace) -> int:
    site = carry.site_packages(Path(args.venv))
    vllm_version = _version_in(site)
    members, compiled = tree_members(site, args.exclude)
    raw = sum(m.size for m in members)
    pins = read_pins(Path(args.requirements).read_text())
    host_file = Path(args.host_packages)
    if not host_file.is_file():
        raise SystemExit(
            f"vllm_bundle: --host-packages expected a file listing the GPU host's packages, "
            f"{host_file} not found"
        )
    wanted = missing_pins(pins, read_host_packages(host_file.read_text()))
    glibc = tuple(int(x) for x in args.glibc.split("."))
    download = pip_download_command(wanted, WHEELS, (glibc[0], glibc[1]))
    print(f"vllm_bundle: vLLM {vllm_version} tree: {len(members)} files, {carry.mib(raw)} raw")
    for m in compiled:
        print(f"  left out, compiled: {m.arcname} ({carry.mib(m.size)})")
    print(f"  wheels the host lacks ({len(wanted)}): {' '.join(f'{n}=={v}' for n, v in wanted)}")
    if args.dry_run:
        print("  would run: " + " ".join(download))
        return 0
    archive = carry.pack(members, BUNDLE_DIR / f"vllm-{vllm_version}-tree.tar.xz")
    if WHEELS.exists():
        for old in WHEELS.glob("*.whl"):
            old.unlink()
    WHEELS.mkdir(parents=True, exist_ok=True)
    subprocess.run(download, check=True)
    wheels = sorted(WHEELS.glob("*.whl"))
    if len(wheels) != len(wanted):
        raise SystemExit(f"vllm_bundle: {len(wanted)} wheels expected, pip gave {len(wheels)}")
    carry.write_manifest(
        MANIFEST,
        {
            "vllm": vllm_version,
            "tree": archive,
            "tree_raw_bytes": raw,
            "skipped": [f"*{s}" for s in SKIPPED_SUFFIXES] + list(SKIPPED_PREFIXES)
            + list(args.exclude) + [m.arcname for m in compiled] + ["__pycache__"],
            "wheels": [{"file": w.name, "bytes": w.stat().st_size} for w in wheels],
            "pins": [f"{n}=={v}" for n, v in pins],
            "host_packages_from": str(host_file),
            "stand_ins": STAND_INS,
        },
    )  # fmt: skip
    return report_sizes(archive, wheels, args.wheel)


def _version_in(site: Path) -> str:
    (info,) = sorted(site.glob("vllm-*.dist-info"))
    return info.name[len("vllm-") : -len(".dist-info")]


def report_sizes(archive: dict[str, object], wheels: list[Path], b12x_wheel: str | None) -> int:
    """Prints what travels and exits 1 if it passes the device tool's carry limit."""
    rows = [("tracked files", tracked_bytes())]
    if b12x_wheel:
        rows.append((Path(b12x_wheel).name, Path(b12x_wheel).stat().st_size))
    peer = carry.DEVICE_DIR / "deepgemm" / "deep_gemm.json"
    if peer.is_file():
        rows.append(("DeepGEMM peer", int(json.loads(peer.read_text())["archive"]["bytes"])))
    rows.append((f"vLLM tree ({archive['file']})", int(str(archive["bytes"]))))
    rows.append((f"{len(wheels)} wheels", sum(w.stat().st_size for w in wheels)))
    total = sum(n for _, n in rows)
    for name, n in rows:
        print(f"  {name:<40} {carry.mib(n):>10}")
    print(f"  {'total carried':<40} {carry.mib(total):>10} of {carry.mib(carry.CARRY_LIMIT_BYTES)}")
    if total > carry.CARRY_LIMIT_BYTES:
        print("vllm_bundle: over the device tool's carry limit", file=sys.stderr)
        return 1
    return 0


# --- install (on the GPU host) -----------------------------------------------------------------


def write_stand_ins(site: Path, real: set[str]) -> list[Path]:
    """Writes the stand-in of every library in :data:`STAND_INS` but those in
    ``real`` (carried for real), and removes a stand-in left for those."""
    written = []
    for module, what in STAND_INS.items():
        path = site / "vllm" / f"{module}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        if module in real:
            path.unlink(missing_ok=True)
            continue
        path.write_text(STAND_IN_SOURCE.format(what=what))
        written.append(path)
    return written


def host_versions(pins: Iterable[str], carried: set[str]) -> list[str]:
    """One line per pin that did not travel: the version this python3 has."""
    lines = []
    for pin in pins:
        name, _, want = pin.partition("==")
        if normalize(name) in carried or normalize(name) == "vllm":
            continue
        try:
            have = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            have = "MISSING"
        lines.append(f"  {name:<24} host {have:<14} tests pin {want}")
    return lines


def cmd_install(args: argparse.Namespace) -> int:
    manifest = carry.read_manifest(MANIFEST)
    archive = carry.check_archive(BUNDLE_DIR, manifest["tree"])
    wheels = [WHEELS / str(w["file"]) for w in manifest["wheels"]]
    site = Path(args.site)
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
           "--upgrade", "--target", str(site), *map(str, wheels)]  # fmt: skip
    if args.dry_run:
        print(f"vllm_bundle: would unpack {archive} into {site}, join {OPS_LIBRARY}'s parts, "
              f"write the stand-ins of {', '.join(STAND_INS)} that did not travel, "
              f"and run: {' '.join(pip)}")  # fmt: skip
        return 0

    def install_wheels() -> None:
        if wheels:
            subprocess.run(pip, check=True)

    sha = str(manifest["tree"]["sha256"])
    count = carry.unpack_once(archive, site, sha, "vllm", then=install_wheels)
    why_not_real = vllm_ops_lib.install(site)
    stand_ins = write_stand_ins(site, set() if why_not_real else {OPS_LIBRARY})
    done = "already there" if count is None else f"{count} files and {len(wheels)} wheels"
    print(f"vllm_bundle: vLLM {manifest['vllm']} in {site}: {done}")
    real = "the real one, carried in parts" if not why_not_real else f"stand-in ({why_not_real})"
    print(f"  {OPS_LIBRARY}: {real}")
    print(f"  stand-ins (register no ops): {', '.join(str(p) for p in stand_ins)}")
    carried = {normalize(w.name.split("-")[0]) for w in wheels}
    print("  from the host's python3:")
    print("\n".join(host_versions(manifest["pins"], carried)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="here: pack vLLM's tree and fetch the wheels")
    b.add_argument("--venv", default=str(carry.REPO / ".venv"), help="the tests' venv")
    b.add_argument("--requirements", default=str(REQUIREMENTS))
    b.add_argument("--host-packages", default=str(HOST_PACKAGES),
                   help="the GPU host's packages (the device notes, or a list)")  # fmt: skip
    b.add_argument("--glibc", default=".".join(map(str, GLIBC)), help="the host's glibc")
    b.add_argument("--exclude", nargs="*", default=[], metavar="PATH",
                   help="more paths under vllm/ to leave out (e.g. vllm-rs)")  # fmt: skip
    b.add_argument("--wheel", help="the b12x wheel that travels too (counted in the sizes)")
    b.add_argument("--dry-run", action="store_true", help="say what would be packed and fetched")
    i = sub.add_parser("install", help="on the GPU host: unpack and install into the site folder")
    i.add_argument("--site", default=str(carry.SITE))
    i.add_argument("--dry-run", action="store_true", help="say what would be installed")
    args = p.parse_args(argv)
    return cmd_build(args) if args.cmd == "build" else cmd_install(args)


if __name__ == "__main__":
    sys.exit(main())
