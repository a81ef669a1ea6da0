"""Tensor metadata through PyTorch's C shim agrees with torch's own getters."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from b12x import _core


def attrs(t):
    shape = list(t.shape)
    strides = list(t.stride())
    if all(d <= 1 for d in shape):  # b12x normalises strides no element ever uses
        strides, acc = [], 1
        for d in reversed(shape):
            strides.insert(0, acc)
            acc *= max(d, 1)
    device = "cpu" if t.is_cpu else f"cuda:{t.get_device()}" if t.is_cuda else None
    return str(t.dtype).removeprefix("torch."), device, shape, strides, t.data_ptr()


base = torch.arange(4 * 6 * 8, dtype=torch.float32).view(4, 6, 8)
CASES = {
    "contiguous": base,
    "offset strided view": base[1:, ::2, 3:],
    "transpose": base.transpose(0, 2),
    "expand stride 0": base[:1, :1, :].expand(5, 3, 8),
    "scalar": torch.tensor(3.0),
    "size-one dims": base[2:3, 4:5, 1:2],
    "empty": torch.empty((0, 7), dtype=torch.int32),
    "fp8": torch.zeros((3, 16, 128), dtype=torch.float8_e4m3fn)[1:],
    "uint8 pages": torch.zeros((4, 8464), dtype=torch.uint8)[:, :8448],
    "bool": torch.zeros(5, dtype=torch.bool),
    "bfloat16": torch.zeros((2, 3), dtype=torch.bfloat16).t(),
    "int64": torch.zeros(9, dtype=torch.int64)[::3],
}


def test_shim_is_in_use_after_the_first_tensor():
    _core.tensor_meta(base)
    assert _core.torch_shim_state() == "trusted"


@pytest.mark.parametrize("name", list(CASES))
def test_shim_matches_torch_getters(name):
    t = CASES[name]
    _core.tensor_meta(base)  # past the one-time comparison
    m = _core.tensor_meta(t)
    assert (m.dtype, m.device, m.shape, m.strides, m.address) == attrs(t)


@pytest.mark.gpu
def test_shim_matches_torch_getters_on_cuda():
    t = torch.zeros((6, 8), device="cuda")[1:, ::2]
    _core.tensor_meta(base)
    m = _core.tensor_meta(t)
    assert (m.dtype, m.device, m.shape, m.strides, m.address) == attrs(t)


def test_meta_tensors_and_subclasses_still_work():
    m = torch.empty((2, 3), device="meta")
    assert _core.tensor_meta(m).device == "meta"  # named (issue 21, item 9)

    class Sub(torch.Tensor):
        pass

    s = base.as_subclass(Sub)
    got, want = _core.tensor_meta(s), _core.tensor_meta(base)
    assert (got.dtype, got.device, got.shape, got.strides) == (
        want.dtype,
        want.device,
        want.shape,
        want.strides,
    )


def test_the_shim_can_be_switched_off():
    code = (
        "import torch; from b12x import _core; "
        "_core.tensor_meta(torch.zeros(3)); print(_core.torch_shim_state())"
    )
    env = {**os.environ, "B12X_TORCH_SHIM": "0"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "off"
