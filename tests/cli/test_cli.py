"""`import b12x` and `b12x doctor` work everywhere, GPU or not."""

from __future__ import annotations

import subprocess
import sys

import b12x
from b12x import _core, cuda


def test_import_exposes_version_and_build_facts():
    info = b12x.build_info()
    assert b12x.__version__ == info["version"]
    assert info["ptx_isa"] == "8.7"
    assert info["ptx_target"] == "compute_89"
    fold = ("indexer_topk", ["b12x_indexer_topk_fold", "b12x_indexer_topk_fold_prefix",
                             "b12x_indexer_topk_stream", "b12x_indexer_topk_slice",
                             "b12x_indexer_topk_merge"])  # fmt: skip
    assert fold in [tuple(m) for m in info["modules"]]
    # every module has a target; only the wgmma scorers are arch-specific
    targets = info["module_targets"]
    assert set(targets) == {name for name, _ in info["modules"]}
    hopper = {"indexer_wgmma", "indexer_hopper", "indexer_select"}
    assert {n for n, t in targets.items() if t != "compute_89"} == hopper
    assert all(targets[n] == "compute_90a" for n in hopper)


def test_the_minimum_driver_is_one_fact():
    """b12x-cuda states it (ptx::MIN_DRIVER); the README and the PTX build
    script say the same number."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    driver = b12x.build_info()["min_driver"]
    assert driver == "570"  # PTX ISA 8.7's driver line
    assert f"NVIDIA driver >= {driver}" in (root / "README.md").read_text()
    assert f"every driver from {driver} on" in (root / "kernels" / "build_ptx.py").read_text()


def test_exception_classes_fit_the_builtins():
    assert issubclass(b12x.ShapeError, ValueError)
    assert issubclass(b12x.DTypeError, TypeError)
    assert issubclass(b12x.CudaError, RuntimeError)
    assert issubclass(b12x.KernelLoadError, b12x.CudaError)
    assert issubclass(b12x.UndeclaredPlanError, RuntimeError)
    for cls in (b12x.ShapeError, b12x.CudaError, b12x.UndeclaredPlanError):
        assert issubclass(cls, b12x.B12xError)


def test_doctor_exits_zero_and_reports():
    out = subprocess.run(
        [sys.executable, "-m", "b12x", "doctor"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "b12x doctor" in out.stdout
    assert "ISA 8.7 for compute_89" in out.stdout
    assert "tensor metadata" in out.stdout
    if not cuda.is_available():
        assert "CPU paths only" in out.stdout or "GPUs" in out.stdout


def test_device_work_without_loaded_kernels_is_an_error_not_a_load():
    if _core.driver_present():
        return  # covered by the GPU tests
    import pytest

    with pytest.raises(b12x.CudaError, match="not loaded on cuda:0"):
        _core.indexer_check(0)
