"""The GPU-host bundles of tools/gpu (carry.py, deepgemm_peer.py, vllm_bundle.py), on CPU.

What goes into each bundle, that an archive unpacks to exactly what was packed
(and nothing outside its folder), the wheels the host lacks and the pip
command that fetches them, and the host-side install into a site folder: all
on small fakes in tmp_path, plus the selection from the real vLLM this venv
has where it is installed.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import carry  # noqa: E402
import deepgemm_peer  # noqa: E402
import vllm_bundle  # noqa: E402
import vllm_ops_lib  # noqa: E402


@pytest.fixture(autouse=True)
def no_carried_ops_library(tmp_path, monkeypatch):
    """The ops library's parts this checkout may hold are not the test's."""
    monkeypatch.setattr(vllm_ops_lib, "OPS_DIR", tmp_path / "no-ops-parts")


def write(root: Path, files: dict[str, bytes | str]) -> None:
    for rel, body in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body if isinstance(body, bytes) else body.encode())


FAKE_SITE = {
    "vllm/__init__.py": "",
    "vllm/platforms/cuda.py": "import vllm._C_stable_libtorch\n",
    "vllm/_C_stable_libtorch.abi3.so": b"\x7fELF lib",
    "vllm/vllm-rs": b"\x7fELF exe",
    "vllm/platforms/__pycache__/cuda.cpython-312.pyc": b"pyc",
    "vllm/stray.pyc": b"pyc",
    "vllm/third_party/deep_gemm/__init__.py": "__version__ = '2.8.1'\n",
    "vllm/third_party/deep_gemm/_C_extension.abi3.so": b"\x7fELF dg",
    "vllm/third_party/deep_gemm/include/deep_gemm/x.cuh": "// header",
    "vllm/third_party/deep_gemm/include/cute/y.hpp": "// header",
    "vllm/third_party/fmha/include/z.hpp": "// kept: only DeepGEMM's headers stay behind",
    "vllm/configs/a.json": "{}",
    "vllm-0.33.0.dist-info/METADATA": "Name: vllm\nVersion: 0.33.0\n",
    "vllm-0.33.0.dist-info/entry_points.txt": "",
}


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "venv" / "lib" / "python3.12" / "site-packages"
    write(root, FAKE_SITE)
    return root


# --- carry -------------------------------------------------------------------------------------


def test_walk_is_sorted_and_leaves_out_bytecode_and_what_skip_rejects(tmp_path):
    write(tmp_path, {"b.py": "", "a/x.py": "", "a/__pycache__/x.pyc": "", "c.pyc": "", "d.txt": ""})
    got = [m.arcname for m in carry.walk(tmp_path, "pkg", lambda rel: rel == "d.txt")]
    assert got == ["pkg/b.py", "pkg/a/x.py"]  # files of a folder first, then its folders


def test_pack_then_unpack_gives_the_same_files_and_the_same_archive_twice(tmp_path):
    write(tmp_path / "src", {"p/__init__.py": "x = 1\n", "p/data.bin": bytes(range(256))})
    members = list(carry.walk(tmp_path / "src", "", lambda rel: False))
    first = carry.pack(members, tmp_path / "one.tar.xz")
    second = carry.pack(members, tmp_path / "two.tar.xz")
    assert first["files"] == 2 and first["sha256"] == second["sha256"]  # no times, no owners
    assert first["sha256"] == carry.sha256(tmp_path / "one.tar.xz")
    assert carry.unpack(tmp_path / "one.tar.xz", tmp_path / "out") == 2
    assert (tmp_path / "out/p/data.bin").read_bytes() == bytes(range(256))
    assert (tmp_path / "out/p/__init__.py").read_text() == "x = 1\n"


def hostile_archive(path: Path, name: str, kind: bytes = tarfile.REGTYPE) -> Path:
    with tarfile.open(path, "w:xz") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
            tar.addfile(info)
        else:
            info.size = 3
            tar.addfile(info, io.BytesIO(b"bad"))
    return path


@pytest.mark.parametrize(
    ("name", "kind"),
    [("../escape.py", tarfile.REGTYPE), ("/abs.py", tarfile.REGTYPE), ("link", tarfile.SYMTYPE)],
)
def test_unpack_refuses_anything_but_files_inside_its_folder(tmp_path, name, kind):
    archive = hostile_archive(tmp_path / "bad.tar.xz", name, kind)
    with pytest.raises(SystemExit, match="expected a file inside"):
        carry.unpack(archive, tmp_path / "out")
    assert not (tmp_path / "escape.py").exists()


def test_unpack_once_skips_what_is_there_and_redoes_an_interrupted_install(tmp_path):
    write(tmp_path / "src", {"m.py": ""})
    entry = carry.pack(carry.walk(tmp_path / "src", "", lambda rel: False), tmp_path / "a.tar.xz")
    site, archive, sha = tmp_path / "site", tmp_path / "a.tar.xz", str(entry["sha256"])

    def broken():
        raise RuntimeError("pip failed")

    with pytest.raises(RuntimeError):
        carry.unpack_once(archive, site, sha, "a", then=broken)
    calls = []
    assert carry.unpack_once(archive, site, sha, "a", then=lambda: calls.append(1)) == 1
    assert carry.unpack_once(archive, site, sha, "a", then=lambda: calls.append(1)) is None
    assert calls == [1] and (site / "m.py").is_file()
    assert carry.unpack_once(archive, site, "0" * 64, "a") == 1  # another archive: again


def test_a_manifest_names_an_archive_whose_checksum_must_match(tmp_path):
    (tmp_path / "a.tar.xz").write_bytes(b"xz")
    entry = {"file": "a.tar.xz", "sha256": carry.sha256(tmp_path / "a.tar.xz")}
    assert carry.check_archive(tmp_path, entry) == tmp_path / "a.tar.xz"
    with pytest.raises(SystemExit, match=r"sha256 expected 0+, got"):
        carry.check_archive(tmp_path, {**entry, "sha256": "0" * 64})
    with pytest.raises(SystemExit, match="build the bundle first"):
        carry.read_manifest(tmp_path / "none.json")


# --- the vLLM bundle ----------------------------------------------------------------------------


def test_the_tree_leaves_out_compiled_code_bytecode_and_deepgemms_headers(site):
    members, compiled = vllm_bundle.tree_members(site)
    names = {m.arcname for m in members}
    assert names == {
        "vllm/__init__.py",
        "vllm/platforms/cuda.py",
        "vllm/third_party/deep_gemm/__init__.py",
        "vllm/third_party/fmha/include/z.hpp",
        "vllm/configs/a.json",
        "vllm-0.33.0.dist-info/METADATA",
        "vllm-0.33.0.dist-info/entry_points.txt",
    }
    assert [m.arcname for m in compiled] == ["vllm/vllm-rs"]  # an ELF file without .so
    more, _ = vllm_bundle.tree_members(site, ["configs"])
    assert "vllm/configs/a.json" not in {m.arcname for m in more}


def test_the_tree_needs_vllm_and_one_dist_info(tmp_path, site):
    with pytest.raises(SystemExit, match="the tests' vLLM"):
        vllm_bundle.tree_members(tmp_path)
    write(site, {"vllm-0.32.0.dist-info/METADATA": ""})
    with pytest.raises(SystemExit, match=r"one vllm-\*\.dist-info expected"):
        vllm_bundle.tree_members(site)


def test_the_installed_vllm_tree_selection():
    pytest.importorskip("vllm")
    import vllm

    members, compiled = vllm_bundle.tree_members(Path(vllm.__file__).parents[1])
    names = [m.arcname for m in members]
    assert "vllm/platforms/cuda.py" in names and "vllm/utils/deep_gemm.py" in names
    assert any(n.startswith("vllm-") and n.endswith(".dist-info/METADATA") for n in names)
    assert not any(n.endswith((".so", ".pyc")) or "__pycache__" in n for n in names)
    assert not any(n.startswith("vllm/third_party/deep_gemm/include/") for n in names)
    assert all(not vllm_bundle.is_compiled(m.path) for m in members)
    assert {m.arcname for m in compiled} <= {"vllm/vllm-rs"}


def test_pins_parse_and_a_line_without_a_pin_names_itself():
    text = "# comment\nvllm==0.33.0\n\npydantic_core==2.50.5  # why\nPyYAML==6.0.4\n"
    assert vllm_bundle.read_pins(text) == [
        ("vllm", "0.33.0"),
        ("pydantic_core", "2.50.5"),
        ("PyYAML", "6.0.4"),
    ]
    with pytest.raises(SystemExit, match="line 2 expected 'name==version', got 'torch>=2'"):
        vllm_bundle.read_pins("a==1\ntorch>=2\n")


def test_the_host_lacks_what_its_package_list_does_not_name():
    notes = "| row | x |\n\nimage holds these. Packages: absl-py, pyyaml, Pydantic-Core, torch.\n"
    host = vllm_bundle.read_host_packages(notes)
    assert host == {"absl-py", "pyyaml", "pydantic-core", "torch"}
    assert vllm_bundle.read_host_packages("a-b\nC_d, e\n") == {"a-b", "c-d", "e"}
    pins = [("vllm", "0.33.0"), ("PyYAML", "6.0.4"), ("pydantic_core", "2"), ("msgspec", "0.23")]
    assert vllm_bundle.missing_pins(pins, host) == [("msgspec", "0.23")]


def test_the_real_pins_against_the_device_notes():
    if not vllm_bundle.HOST_PACKAGES.is_file():
        pytest.skip(f"{vllm_bundle.HOST_PACKAGES} is not on this machine")
    pins = vllm_bundle.read_pins(vllm_bundle.REQUIREMENTS.read_text())
    host = vllm_bundle.read_host_packages(vllm_bundle.HOST_PACKAGES.read_text())
    missing = {vllm_bundle.normalize(n) for n, _ in vllm_bundle.missing_pins(pins, host)}
    assert {"pydantic", "pydantic-core", "msgspec", "pyzmq", "xgrammar"} <= missing
    assert not {"torch", "vllm", "transformers", "numpy"} & missing


def test_pip_fetches_cp312_wheels_for_every_glibc_the_host_runs():
    tags = vllm_bundle.manylinux_platforms((2, 39))
    assert tags[0] == "manylinux_2_39_x86_64" and tags[-2:] == [
        "manylinux2014_x86_64",
        "manylinux1_x86_64",
    ]
    assert {"manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64"} <= set(tags)
    cmd = vllm_bundle.pip_download_command([("a", "1"), ("b", "2")], Path("/w"), (2, 28))
    assert cmd[1:4] == ["-m", "pip", "download"]
    for flag in ("--no-deps", "--only-binary=:all:"):
        assert flag in cmd
    assert cmd[cmd.index("--python-version") + 1] == "3.12"
    assert cmd[cmd.index("--dest") + 1] == "/w" and cmd[-2:] == ["a==1", "b==2"]
    assert "manylinux_2_29_x86_64" not in cmd and "manylinux_2_28_x86_64" in cmd


def bundle_in(tmp_path, monkeypatch, module):
    """Points a bundle script's folders at tmp_path."""
    bundle = tmp_path / "device" / module.__name__
    monkeypatch.setattr(module, "BUNDLE_DIR", bundle)
    manifest = bundle / module.MANIFEST.name
    monkeypatch.setattr(module, "MANIFEST", manifest)
    if hasattr(module, "WHEELS"):
        monkeypatch.setattr(module, "WHEELS", bundle / "wheels")
    return bundle, manifest


def test_install_unpacks_the_tree_writes_the_stand_in_and_says_what_the_host_has(
    tmp_path, monkeypatch, site, capsys
):
    bundle, manifest = bundle_in(tmp_path, monkeypatch, vllm_bundle)
    members, _ = vllm_bundle.tree_members(site)
    entry = carry.pack(members, bundle / "vllm-0.33.0-tree.tar.xz")
    pins = ["vllm==0.33.0", "pytest==0", "no-such-dist==1"]
    doc = {"vllm": "0.33.0", "tree": entry, "wheels": [], "pins": pins}
    carry.write_manifest(manifest, doc)
    target = tmp_path / "site"
    assert vllm_bundle.main(["install", "--site", str(target), "--dry-run"]) == 0
    assert not target.exists()
    assert vllm_bundle.main(["install", "--site", str(target)]) == 0
    out = capsys.readouterr().out
    assert (target / "vllm/platforms/cuda.py").is_file() and not (target / "vllm/vllm-rs").exists()
    for module in ("_C_stable_libtorch", "vllm_flash_attn/_vllm_fa2_C"):
        stand_in = (target / f"vllm/{module}.py").read_text()
        assert "B12X_STAND_IN = True" in stand_in and "registers no" in stand_in
    assert "_C_stable_libtorch: stand-in (" in out and "not carried" in out
    assert "pytest" in out and "no-such-dist" in out and "MISSING" in out
    assert vllm_bundle.main(["install", "--site", str(target)]) == 0
    assert "already there" in capsys.readouterr().out


def test_the_stand_in_is_what_the_bench_reports_as_such(tmp_path):
    import importlib.util

    from b12x.bench import indexer_peers

    (tmp_path / "vllm").mkdir()
    path, _ = vllm_bundle.write_stand_ins(tmp_path, set())
    spec = importlib.util.spec_from_file_location("stand_in", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = indexer_peers.import_vllm_ops(lambda name: module, lambda ns: None)
    assert not found.ok and "stand-in" in found.detail


def test_build_dry_run_names_the_tree_and_the_wheels_and_writes_nothing(
    tmp_path, monkeypatch, site, capsys
):
    bundle, _ = bundle_in(tmp_path, monkeypatch, vllm_bundle)
    (tmp_path / "req.txt").write_text("vllm==0.33.0\nmsgspec==0.23.0\npyyaml==6.0.4\n")
    (tmp_path / "host.txt").write_text("pyyaml, torch")
    code = vllm_bundle.main([
        "build", "--venv", str(tmp_path / "venv"), "--requirements", str(tmp_path / "req.txt"),
        "--host-packages", str(tmp_path / "host.txt"), "--dry-run",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0 and not bundle.exists()
    assert "vLLM 0.33.0 tree: 7 files" in out and "left out, compiled: vllm/vllm-rs" in out
    assert "wheels the host lacks (1): msgspec==0.23.0" in out and "pip download" in out
    with pytest.raises(SystemExit, match="--host-packages expected a file"):
        vllm_bundle.main(["build", "--venv", str(tmp_path / "venv"),
                          "--host-packages", str(tmp_path / "none"), "--dry-run"])  # fmt: skip


# --- the DeepGEMM peer --------------------------------------------------------------------------


def test_the_deepgemm_peer_is_the_whole_package_imported_as_deep_gemm(tmp_path, monkeypatch, site):
    package = deepgemm_peer.package_dir(tmp_path / "venv")
    assert deepgemm_peer.version_of(package) == "2.8.1"
    names = {m.arcname for m in deepgemm_peer.members(package)}
    assert names == {
        "deep_gemm/__init__.py",
        "deep_gemm/_C_extension.abi3.so",
        "deep_gemm/include/deep_gemm/x.cuh",
        "deep_gemm/include/cute/y.hpp",
    }
    bundle, manifest = bundle_in(tmp_path, monkeypatch, deepgemm_peer)
    assert deepgemm_peer.main(["pack", "--venv", str(tmp_path / "venv")]) == 0
    doc = json.loads(manifest.read_text())
    assert doc["version"] == "2.8.1" and doc["archive"]["files"] == 4
    assert (bundle / "deep_gemm-2.8.1.tar.xz").is_file()
    target = tmp_path / "site"
    assert deepgemm_peer.main(["unpack", "--site", str(target)]) == 0
    assert (target / "deep_gemm/include/cute/y.hpp").read_text() == "// header"


def test_without_vllms_deepgemm_packing_says_where_it_looked(tmp_path):
    with pytest.raises(SystemExit, match="expected a virtual environment"):
        deepgemm_peer.package_dir(tmp_path)
    (tmp_path / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    with pytest.raises(SystemExit, match="vLLM's DeepGEMM"):
        deepgemm_peer.package_dir(tmp_path)


def test_sizes_count_everything_that_travels_and_fail_past_the_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(carry, "DEVICE_DIR", tmp_path)
    wheel = tmp_path / "b12x.whl"
    wheel.write_bytes(b"w" * 1000)
    monkeypatch.setattr(vllm_bundle, "tracked_bytes", lambda: 5000)
    archive = {"file": "tree.tar.xz", "bytes": 3000}
    assert vllm_bundle.report_sizes(archive, [wheel], str(wheel)) == 0
    out = capsys.readouterr().out
    assert "total carried" in out and "b12x.whl" in out
    monkeypatch.setattr(carry, "CARRY_LIMIT_BYTES", 9000)
    assert vllm_bundle.report_sizes(archive, [wheel], str(wheel)) == 1  # 10000 bytes
