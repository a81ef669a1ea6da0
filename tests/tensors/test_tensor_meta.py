"""Tensor metadata extraction: torch's fast path and the DLPack path agree."""

from __future__ import annotations

import b12x
import numpy as np
import pytest
import torch
from b12x import _core

TORCH_DTYPES = {
    torch.float8_e4m3fn: "float8_e4m3fn",
    torch.bfloat16: "bfloat16",
    torch.float16: "float16",
    torch.float32: "float32",
    torch.int32: "int32",
    torch.uint8: "uint8",
}


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES), ids=list(TORCH_DTYPES.values()))
def test_torch_path_reads_every_b12x_dtype(dtype):
    t = torch.empty((3, 5, 7), dtype=dtype)
    m = _core.tensor_meta(t)
    assert m.dtype == TORCH_DTYPES[dtype]
    assert m.device == "cpu"
    assert m.shape == [3, 5, 7]
    assert m.strides == [35, 7, 1]
    assert m.data_ptr == t.data_ptr()
    assert m.byte_offset == 0


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES), ids=list(TORCH_DTYPES.values()))
def test_dlpack_path_matches_torch_path(dtype):
    base = torch.empty((4, 6, 8), dtype=dtype)
    view = base[1:, ::2, :]  # an offset, strided view
    fast = _core.tensor_meta(view)
    try:
        slow = _core._tensor_meta_dlpack(view)
    except (BufferError, RuntimeError, TypeError) as e:  # torch builds without fp8 DLPack
        pytest.skip(f"torch cannot export {dtype} through DLPack: {e}")
    assert (slow.dtype, slow.device, slow.shape, slow.strides) == (
        fast.dtype,
        fast.device,
        fast.shape,
        fast.strides,
    )
    assert slow.address == fast.address == view.data_ptr()


@pytest.mark.parametrize(
    ("np_dtype", "name"),
    [(np.float16, "float16"), (np.float32, "float32"), (np.int32, "int32"), (np.uint8, "uint8")],
)
def test_numpy_goes_through_dlpack(np_dtype, name):
    a = np.zeros((4, 3), dtype=np_dtype)[:, 1:]
    got = _core.tensor_meta(a)
    assert got.dtype == name
    assert got.device == "cpu"
    assert got.shape == [4, 2]
    assert got.strides == [3, 1]
    assert got.address == a.__array_interface__["data"][0]


def test_tensor_subclass_uses_the_torch_path():
    p = torch.nn.Parameter(torch.zeros(4, 4))
    assert _core.tensor_meta(p).shape == [4, 4]


@pytest.mark.parametrize("bad", [None, 3, [1, 2], "tensor", object()])
def test_non_tensors_are_rejected_with_a_type_error(bad):
    with pytest.raises(b12x.NotATensorError, match="expected a tensor") as info:
        _core.tensor_meta(bad)
    assert isinstance(info.value, TypeError)
