"""Every shared validation error: operand name, expected and actual value."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x import _core


def check(t, **kw):
    return _core._validate_operand(t, "x", **kw)


def test_valid_operand_returns_its_byte_extent():
    t = torch.empty((4, 8), dtype=torch.bfloat16)
    assert check(t, dtypes=["bfloat16"], device="cpu", rank=2, contiguous=True, align=16) == 64


def test_wrong_dtype():
    with pytest.raises(b12x.DTypeError, match=r"x expected dtype int32, got float32") as e:
        check(torch.empty(4), dtypes=["int32"])
    assert isinstance(e.value, TypeError)


def test_wrong_dtype_lists_every_accepted_dtype():
    with pytest.raises(TypeError, match=r"one of \{float32, bfloat16\}, got int64"):
        check(torch.empty(4, dtype=torch.int64), dtypes=["float32", "bfloat16"])


def test_wrong_device():
    with pytest.raises(b12x.DeviceError, match=r"x expected device cuda:0, got cpu") as e:
        check(torch.empty(4), device="cuda:0")
    assert isinstance(e.value, ValueError)


def test_wrong_rank():
    with pytest.raises(b12x.ShapeError, match=r"x expected rank 3, got rank 2 \(shape \[4, 4\]\)"):
        check(torch.empty(4, 4), rank=3)


def test_non_contiguous():
    t = torch.empty(4, 8)[:, ::2]
    with pytest.raises(b12x.LayoutError, match=r"expected contiguous .* got strides \[8, 2\]"):
        check(t, contiguous=True)


def test_weak_contiguity_accepts_a_transpose_but_not_a_gap():
    t = torch.empty(4, 8)
    check(t.t(), weakly_contiguous=True)
    with pytest.raises(b12x.LayoutError, match="weakly contiguous"):
        check(t[:, :4], weakly_contiguous=True)


def test_misaligned():
    t = torch.empty(64, dtype=torch.uint8)[4:]
    with pytest.raises(
        b12x.AlignmentError,
        match=r"16-byte alignment, got address 0x[0-9a-f]+ "
        r"\(address % 16 = 4\)",
    ):
        check(t, align=16)


def test_negative_stride_has_no_byte_extent():
    class Flipped:
        """A DLPack producer reporting a negative stride (torch cannot make one)."""

        def __init__(self):
            import numpy as np

            self.a = np.arange(8, dtype=np.float32)[::-1]

        def __dlpack__(self, stream=None):
            return self.a.__dlpack__()

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    with pytest.raises(b12x.LayoutError, match="non-negative"):
        check(Flipped())


def test_extent_overflow():
    import numpy as np

    # 4 * 2**62 + 2 bytes: past u64. as_strided never touches the memory.
    t = np.lib.stride_tricks.as_strided(np.zeros(1, np.uint8), shape=(5, 2), strides=(2**62, 1))
    with pytest.raises(b12x.CapacityError, match="byte extent overflows 64 bits"):
        check(t)


def test_not_a_tensor():
    with pytest.raises(b12x.NotATensorError, match=r"x expected a tensor .* got dict"):
        check({})


def test_bad_check_arguments_are_config_errors():
    with pytest.raises(b12x.ConfigError, match=r"^validate_operand: dtypes expected dtype names"):
        check(torch.empty(4), dtypes=["float33"])
    with pytest.raises(b12x.ConfigError, match=r"^validate_operand: device expected 'cpu' or"):
        check(torch.empty(4), device="gpu0")
