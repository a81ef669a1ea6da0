"""tools/gpu/vllm_ops_lib.py: vLLM's op library cut into parts here and joined on the host.

On a fake library in tmp_path: the parts join back to the same bytes, a
missing or altered part leaves the library out and says why, and a library
that does not load into torch is removed again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import carry  # noqa: E402
import vllm_ops_lib  # noqa: E402


@pytest.mark.parametrize(
    "sizes, lengths",
    [((1,), [2**20, 2**20 // 2]), ((1, 1), [2**20, 2**20 // 2]), ((4,), [3 * 2**19])],
)
def test_split_cuts_parts_of_the_given_sizes_and_the_rest_last(sizes, lengths):
    data = bytes(range(256)) * (3 * 2**19 // 256)
    parts = vllm_ops_lib.split(data, sizes)
    assert [len(p) for p in parts] == lengths
    assert b"".join(parts) == data


@pytest.fixture
def packed(tmp_path, monkeypatch):
    venv = tmp_path / "venv"
    lib = venv / "lib/python3.12/site-packages/vllm" / vllm_ops_lib.LIBRARY
    lib.parent.mkdir(parents=True)
    # incompressible, so that it really spans two parts of 1 MiB
    lib.write_bytes(os.urandom(3 * 2**20 // 2))
    out = tmp_path / "ops"
    monkeypatch.setattr(vllm_ops_lib, "OPS_DIR", out)
    monkeypatch.setattr(vllm_ops_lib, "MANIFEST", out / "vllm_ops.json")
    monkeypatch.setattr(carry, "REPO", tmp_path)
    assert vllm_ops_lib.main(["pack", "--venv", str(venv), "--part-mib", "1"]) == 0
    return lib, out


def test_the_parts_join_to_the_library_which_installs_once(packed, tmp_path, monkeypatch):
    lib, out = packed
    assert sorted(p.name for p in out.glob("part-*")) == ["part-00.xz", "part-01.xz"]
    loaded = []
    monkeypatch.setattr(vllm_ops_lib, "loads", lambda path: loaded.append(path) or "")
    site = tmp_path / "site"
    assert vllm_ops_lib.install(site) == ""
    assert (site / "vllm" / lib.name).read_bytes() == lib.read_bytes()
    assert vllm_ops_lib.install(site) == "" and len(loaded) == 1  # already there: not redone


def test_a_missing_part_leaves_the_library_out_and_names_the_part(packed, tmp_path):
    _, out = packed
    (out / "part-01.xz").unlink()
    why = vllm_ops_lib.install(tmp_path / "site")
    assert "part-01.xz" in why and not (tmp_path / "site/vllm").exists()


def test_a_stale_library_is_removed_when_the_new_one_cannot_be_installed(packed, tmp_path):
    _, out = packed
    stale = tmp_path / "site" / "vllm" / vllm_ops_lib.LIBRARY
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"an older build")
    (out / "part-01.xz").unlink()
    assert "part-01.xz" in vllm_ops_lib.install(tmp_path / "site")
    assert not stale.exists()  # the stand-in, not the old library, answers the import


def test_an_altered_part_is_refused(packed, tmp_path):
    _, out = packed
    part = out / "part-00.xz"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    assert "sha256" in vllm_ops_lib.install(tmp_path / "site")


def test_a_library_that_does_not_load_is_removed_and_says_why(packed, tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_ops_lib, "loads", lambda path: "undefined symbol: foo")
    site = tmp_path / "site"
    why = vllm_ops_lib.install(site)
    assert "does not load" in why and "undefined symbol: foo" in why
    assert not (site / "vllm" / vllm_ops_lib.LIBRARY).exists()


def test_loads_reports_the_childs_last_error_line(tmp_path):
    bad = tmp_path / "not_a_library.so"
    bad.write_bytes(b"not an ELF file")
    assert vllm_ops_lib.loads(bad) != ""
