"""Packing things for a GPU host that has no network: file selection, xz tarballs, manifests.

Used by ``deepgemm_peer.py`` and ``vllm_bundle.py``. Bundles go under ``.device/``
(git-ignored) so the device tool can carry them; on the host they unpack into one
site folder put on ``PYTHONPATH`` (:data:`SITE`).
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEVICE_DIR = REPO / ".device"
# where the bundles unpack on the GPU host; put on PYTHONPATH (site.sh)
SITE = DEVICE_DIR / "site"
# the device tool's limit on everything carried (tracked files travel too)
CARRY_LIMIT_BYTES = 64 * 2**20
XZ_PRESET = 9


@dataclass(frozen=True)
class Member:
    """One file of a bundle: where it is here and its name inside the archive."""

    path: Path
    arcname: str
    size: int


def walk(root: Path, arc_root: str, skip: Callable[[str], bool]) -> Iterator[Member]:
    """Every file under ``root`` (sorted, ``__pycache__`` folders left out) whose
    path relative to ``root`` (POSIX form) ``skip`` does not reject."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            path = Path(dirpath, name)
            rel = path.relative_to(root).as_posix()
            if skip(rel) or name.endswith(".pyc"):
                continue
            yield Member(path, f"{arc_root}/{rel}" if arc_root else rel, path.stat().st_size)


def site_packages(venv: Path) -> Path:
    """The site-packages folder of a virtual environment."""
    found = sorted(glob.glob(str(venv / "lib" / "python3*" / "site-packages")))
    if not found:
        raise SystemExit(f"carry: {venv} expected a virtual environment, found no site-packages")
    return Path(found[-1])


def pack(members: Iterable[Member], out: Path) -> dict[str, object]:
    """Writes ``members`` to the xz tarball ``out``; returns its size, file count and sha256.

    File times and owners are fixed, so the same files give the same archive."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")
    count = 0
    with tarfile.open(tmp, "w:xz", preset=XZ_PRESET) as tar:
        for m in members:
            info = tar.gettarinfo(str(m.path), arcname=m.arcname)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            with open(m.path, "rb") as f:
                tar.addfile(info, f)
            count += 1
    tmp.replace(out)
    return {"file": out.name, "bytes": out.stat().st_size, "files": count, "sha256": sha256(out)}


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unpack(archive: Path, dest: Path) -> int:
    """Extracts ``archive`` into ``dest`` (plain files and folders only, every
    name inside ``dest``); returns the number of files."""
    dest.mkdir(parents=True, exist_ok=True)
    root = dest.resolve()
    with tarfile.open(archive, "r:xz") as tar:
        members = tar.getmembers()
        for m in members:
            target = (root / m.name).resolve()
            if not (m.isfile() or m.isdir()) or root not in (target, *target.parents):
                raise SystemExit(f"carry: {archive}: {m.name!r} expected a file inside {dest}")
        if sys.version_info >= (3, 12):
            tar.extractall(root, filter="data")
        else:
            tar.extractall(root)  # members checked above
    return sum(m.isfile() for m in members)


def unpack_once(
    archive: Path, dest: Path, sha: str, name: str, then: Callable[[], object] | None = None
) -> int | None:
    """:func:`unpack` (then ``then()``) unless ``dest`` already holds this archive:
    a stamp of its sha256, named after ``name``. None when it did. The stamp is
    written last, so an interrupted install is redone."""
    stamp = dest / f".{name}.sha256"
    if stamp.is_file() and stamp.read_text().strip() == sha:
        return None
    count = unpack(archive, dest)
    if then is not None:
        then()
    stamp.write_text(sha + "\n")
    return count


def write_manifest(path: Path, doc: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def read_manifest(path: Path) -> dict[str, object]:
    if not path.is_file():
        raise SystemExit(f"carry: {path} expected (build the bundle first, here), not found")
    doc: dict[str, object] = json.loads(path.read_text())
    return doc


def check_archive(manifest_dir: Path, entry: dict[str, object]) -> Path:
    """The archive a manifest names, checked against its recorded sha256."""
    path = manifest_dir / str(entry["file"])
    if not path.is_file():
        raise SystemExit(f"carry: {path} expected (named by its manifest), not found")
    got = sha256(path)
    if got != entry["sha256"]:
        raise SystemExit(f"carry: {path} sha256 expected {entry['sha256']}, got {got}")
    return path


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"
