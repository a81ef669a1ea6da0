"""Tensor extraction against hostile producers: malformed DLPack capsules, lying
``__dlpack__`` / ``__dlpack_device__`` / ``data_ptr()``, non-torch operands of
``bind`` and bad ``B12X_TORCH_SHIM`` values. Nothing crashes the interpreter;
every failure is a B12xError naming the operand."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys

import b12x
import pytest
import torch
from b12x import _core
from b12x.attention import dsa_indexer as di
from dsa_indexer_cases import caps_for, make_inputs, operands
from hypothesis import given, settings
from hypothesis import strategies as st


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device_type", ctypes.c_int32),
        ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("code", ctypes.c_uint8),
        ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16),
        ("shape", ctypes.c_void_p),
        ("strides", ctypes.c_void_p),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class Producer:
    """A DLPack producer whose capsule holds exactly the fields it is given.

    The capsule has no destructor; the struct, shape and strides arrays live
    as long as the producer.
    """

    def __init__(
        self,
        *,
        shape=(3, 4),
        strides=None,
        ndim=None,
        null_shape=False,
        device=(1, 0),
        capsule_device=None,
        dtype=(2, 32, 1),
        data=0x10000,
        byte_offset=0,
        name=b"dltensor",
    ):
        self.device = device
        self.name = name
        # two spare entries: a lying ndim one past the shape still reads owned memory
        self.shape = (ctypes.c_int64 * (len(shape) + 2))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * (len(strides) + 2))(*strides)
        t = DLManagedTensor()
        t.dl_tensor.data = data
        t.dl_tensor.device_type, t.dl_tensor.device_id = capsule_device or device
        t.dl_tensor.ndim = len(shape) if ndim is None else ndim
        t.dl_tensor.code, t.dl_tensor.bits, t.dl_tensor.lanes = dtype
        t.dl_tensor.shape = None if null_shape else ctypes.addressof(self.shape)
        t.dl_tensor.strides = None if self.strides is None else ctypes.addressof(self.strides)
        t.dl_tensor.byte_offset = byte_offset
        self.managed = t

    def __dlpack_device__(self):
        return self.device

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self.managed), self.name, None)


def meta(obj):
    return _core.tensor_meta(obj)


def refused(obj, match):
    with pytest.raises(b12x.B12xError, match=match) as e:
        meta(obj)
    return e.value


def test_a_well_formed_fake_producer_is_read_exactly():
    m = meta(Producer(shape=(3, 4), strides=(8, 2), data=0x20000, byte_offset=64))
    assert (m.dtype, m.device, m.shape, m.strides) == ("float32", "cpu", [3, 4], [8, 2])
    assert (m.data_ptr, m.byte_offset, m.address) == (0x20000, 64, 0x20040)


def test_null_strides_mean_compact_row_major():
    assert meta(Producer(shape=(3, 4, 5))).strides == [20, 5, 1]


def test_rank_zero_may_have_a_null_shape():
    m = meta(Producer(shape=(), null_shape=True))
    assert (m.shape, m.strides) == ([], [])


def test_null_shape_with_dimensions_is_refused_not_a_crash():
    e = refused(
        Producer(shape=(3, 4), null_shape=True),
        r"^tensor_meta: tensor expected a tensor with readable metadata, got "
        r"test_tensor_extraction_hostile.Producer: "
        r"its DLPack tensor has a NULL shape for ndim = 2$",
    )
    assert isinstance(e, b12x.NotATensorError) and isinstance(e, TypeError)


@pytest.mark.parametrize("ndim", [-1, -(2**31)])
def test_negative_ndim_is_refused(ndim):
    refused(Producer(ndim=ndim), rf"its DLPack tensor has ndim = {ndim}$")


def test_ndim_past_the_rank_limit_is_a_shape_error():
    with pytest.raises(b12x.ShapeError, match=r"tensor expected rank <= 8, got rank 9"):
        meta(Producer(shape=(1,) * 9))


def test_negative_extents_are_refused():
    refused(Producer(shape=(3, -4)), r"its DLPack tensor has shape\[1\] = -4$")


@pytest.mark.parametrize(
    ("name", "why"),
    [
        (b"used_dltensor", "a capsule another consumer already took"),
        (b"used_dltensor_versioned", "a capsule another consumer already took"),
        (b"dltensor_versioned", "a versioned capsule"),
        (b"something", "a capsule named \"something\", not 'dltensor'"),
        (None, "an unnamed capsule"),
    ],
)
def test_capsules_with_other_names_are_refused(name, why):
    refused(Producer(name=name), rf"__dlpack__\(\) returned {why}")


def test_a_consumed_torch_capsule_is_refused():
    t = torch.zeros(4)
    capsule = t.__dlpack__()
    torch.from_dlpack(capsule)  # renames it "used_dltensor"

    class Replays:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, stream=None):
            return capsule

    refused(Replays(), r"already took")


class Lying:
    """Every DLPack method configurable: a value to return or an exception to raise."""

    def __init__(self, device=(1, 0), capsule=None):
        self._device, self._capsule = device, capsule

    def __dlpack_device__(self):
        if isinstance(self._device, BaseException):
            raise self._device
        return self._device

    def __dlpack__(self, stream=None):
        if isinstance(self._capsule, BaseException):
            raise self._capsule
        return self._capsule if self._capsule is not None else torch.zeros(3).__dlpack__()


@pytest.mark.parametrize(
    ("device", "why"),
    [
        (ValueError("boom"), r"__dlpack_device__\(\) raised ValueError: boom"),
        ("cpu", r"__dlpack_device__\(\) returned 'cpu', not a \(device_type, device_id\) pair"),
        ((1,), r"__dlpack_device__\(\) returned \(1,\), not a"),
        ((1, 0, 0), r"__dlpack_device__\(\) returned \(1, 0, 0\), not a"),
        ((2**40, 0), r"__dlpack_device__\(\) returned \(1099511627776, 0\), not a"),
        (None, r"__dlpack_device__\(\) returned None, not a"),
    ],
)
def test_a_lying_dlpack_device_is_named(device, why):
    e = refused(Lying(device=device), rf"^tensor_meta: tensor expected a tensor .*: {why}")
    if isinstance(device, Exception):
        assert e.__cause__ is device


@pytest.mark.parametrize(
    ("capsule", "why"),
    [
        (RuntimeError("no"), r"__dlpack__\(\) raised RuntimeError: no"),
        (BufferError("read-only"), r"__dlpack__\(\) raised BufferError: read-only"),
        (7, r"__dlpack__\(\) returned int, not a DLPack capsule"),
        ("dltensor", r"__dlpack__\(\) returned str, not a DLPack capsule"),
    ],
)
def test_a_lying_dlpack_is_named(capsule, why):
    refused(Lying(capsule=capsule), why)


def test_device_disagreement_is_refused():
    refused(
        Producer(device=(2, 0), capsule_device=(1, 0)),
        r"__dlpack_device__\(\) says \(2, 0\) but its capsule holds a tensor on \(1, 0\)",
    )


def test_a_negative_cuda_device_id_is_refused():
    refused(Producer(device=(2, -1)), r"its DLPack tensor is on CUDA device -1$")


def test_keyboard_interrupt_passes_through():
    with pytest.raises(KeyboardInterrupt):
        meta(Lying(capsule=KeyboardInterrupt()))


def test_a_raising_dlpack_attribute_is_named():
    class Prop:
        @property
        def __dlpack__(self):
            raise RuntimeError("lookup fails")

    refused(Prop(), r"looking up __dlpack__ raised RuntimeError: lookup fails")


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        ((5, 64, 1), "complex64"),
        ((1, 16, 1), "uint16"),
        ((11, 8, 1), "float8_e4m3fnuz"),
        ((2, 32, 4), "a dtype b12x does not know"),
        ((99, 8, 1), "an unknown DLPack type (code 99, 8 bits)"),
    ],
)
def test_odd_dlpack_dtypes_display_readably(dtype, name):
    assert meta(Producer(dtype=dtype)).dtype == name
    with pytest.raises(b12x.DTypeError, match=re.escape(f"expected dtype int32, got {name}")):
        _core._validate_operand(Producer(dtype=dtype), "x", dtypes=["int32"])


@pytest.mark.parametrize(
    ("dtype", "name"),
    [
        (torch.complex64, "complex64"),
        (torch.complex128, "complex128"),
        (torch.uint16, "uint16"),
        (torch.uint64, "uint64"),
        (torch.float8_e4m3fnuz, "float8_e4m3fnuz"),
        (torch.bits16, "a dtype b12x does not know"),
    ],
)
def test_odd_torch_dtypes_display_readably(dtype, name):
    t = torch.empty(4, dtype=dtype)
    assert meta(t).dtype == name
    assert "code=255" not in repr(meta(t))


# --- torch tensor subclasses that lie -----------------------------------------------------


def lying_subclass(**overrides):
    class Liar(torch.Tensor):
        pass

    for name, value in overrides.items():
        if isinstance(value, BaseException):

            def fail(self, *a, _e=value, **k):
                raise _e

            setattr(Liar, name, property(fail) if name in ("shape", "dtype", "is_cuda") else fail)
        elif name in ("shape", "dtype", "is_cuda", "is_cpu"):
            setattr(Liar, name, property(lambda self, _v=value: _v))
        else:
            setattr(Liar, name, lambda self, *a, _v=value, **k: _v)
    return torch.zeros((2, 3)).as_subclass(Liar)


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"data_ptr": RuntimeError("gone")}, r"tensor.data_ptr\(\) raised RuntimeError: gone"),
        ({"data_ptr": -5}, r"data_ptr\(\) returned -5, not an address"),
        ({"data_ptr": "0x10"}, r"data_ptr\(\) returned '0x10', not an address"),
        ({"data_ptr": 2**70}, r"data_ptr\(\) returned 1180591620717411303424, not an address"),
        ({"shape": [2, 3]}, r"shape is \[2, 3\], not a tuple"),
        ({"shape": (2, "3")}, r"shape\[1\] is '3', not a 64-bit integer"),
        ({"shape": (2, 2**64)}, r"shape\[1\] is 18446744073709551616, not a 64-bit integer"),
        ({"shape": (2, -3)}, r"shape\[1\] is -3"),
        ({"stride": (3,)}, r"stride\(\) has 1 entries for the 2 dimensions of its shape"),
        ({"stride": None}, r"stride\(\) is None, not a tuple"),
        ({"is_cuda": ValueError("?")}, r"tensor.is_cuda raised ValueError: \?"),
        ({"is_cuda": True, "get_device": -1}, r"get_device\(\) returned -1 for a CUDA tensor"),
    ],
)
def test_lying_subclasses_are_named(overrides, why):
    with pytest.raises(b12x.NotATensorError, match=rf"^bind: q_fp8 expected a tensor .*: {why}$"):
        di_bind_one(lying_subclass(**overrides))


def di_bind_one(q):
    """bind with ``q`` as q_fp8 (every other operand valid)."""
    inputs = make_inputs(rows=2, heads=16, width=2, lengths=[64, 64])
    plan = di.plan(caps_for(inputs, 512))
    di.bind(plan, **operands(inputs, plan, q_fp8=q))


# --- non-torch operands of bind ----------------------------------------------------------


@pytest.fixture
def bind_case():
    inputs = make_inputs(rows=2, heads=16, width=2, lengths=[64, 64])
    plan = di.plan(caps_for(inputs, 512))
    return plan, operands(inputs, plan)


@pytest.mark.parametrize(
    "operand", ["scratch", "query_weights", "page_table", "cache_lengths", "output_indices"]
)
def test_numpy_operands_are_refused_at_bind_not_in_run(bind_case, operand):
    plan, ops = bind_case
    ops[operand] = ops[operand].numpy()
    with pytest.raises(
        b12x.NotATensorError,
        match=rf"^bind: {operand} expected a torch.Tensor, got numpy.ndarray; bind keeps the "
        r"tensor objects .* convert it first with torch.from_dlpack \(no copy\)$",
    ):
        di.bind(plan, **ops)
    # the remedy the message names works end to end
    ops[operand] = torch.from_dlpack(ops[operand])
    di.run(di.bind(plan, **ops))


def test_a_fake_producer_is_refused_at_bind(bind_case):
    plan, ops = bind_case
    ops["active_width"] = Producer(shape=(1,), dtype=(0, 32, 1))
    with pytest.raises(b12x.NotATensorError, match=r"^bind: active_width expected a torch.Tensor"):
        di.bind(plan, **ops)


# --- B12X_TORCH_SHIM ----------------------------------------------------------------------

SHIM_PROBE = (
    "import torch, b12x; from b12x import _core\n"
    "try:\n"
    "    _core.tensor_meta(torch.zeros(3)); print(_core.torch_shim_state())\n"
    "except b12x.ConfigError as e:\n"
    "    print(_core.torch_shim_state(), '|', e)\n"
)


@pytest.mark.parametrize(
    ("value", "state"),
    [("off", "off"), ("No", "off"), (" TRUE ", "trusted"), ("", "trusted")],
)
def test_the_shim_switch_accepts_its_documented_values(value, state):
    out = subprocess.run(
        [sys.executable, "-c", SHIM_PROBE],
        env={**os.environ, "B12X_TORCH_SHIM": value},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == state


def test_the_shim_switch_refuses_other_values_by_name():
    out = subprocess.run(
        [sys.executable, "-c", SHIM_PROBE],
        env={**os.environ, "B12X_TORCH_SHIM": "maybe"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == (
        "invalid | environment: B12X_TORCH_SHIM expected one of 1/on/true/yes (on) or "
        '0/off/false/no (off), or unset, got "maybe"'
    )


# --- random capsules: a B12xError or a faithful read, never a crash -----------------------


@settings(max_examples=300, deadline=None)
@given(
    shape=st.lists(st.integers(-3, 2**40), max_size=10),
    ndim_delta=st.sampled_from([0, 0, 0, -1, 1, -(2**31)]),
    null_shape=st.booleans(),
    strides=st.none() | st.lists(st.integers(-(2**62), 2**62), min_size=10, max_size=10),
    device=st.tuples(st.integers(-2, 20), st.integers(-(2**31), 2**31 - 1)),
    capsule_device=st.none() | st.tuples(st.integers(1, 2), st.integers(-1, 1)),
    dtype=st.tuples(st.integers(0, 255), st.integers(0, 255), st.integers(0, 65535)),
    data=st.integers(0, 2**64 - 1),
    byte_offset=st.integers(0, 2**64 - 1),
    name=st.sampled_from([b"dltensor", b"used_dltensor", b"dltensor_versioned", b"x", None]),
)
def test_random_capsules_never_crash(
    shape, ndim_delta, null_shape, strides, device, capsule_device, dtype, data, byte_offset, name
):
    ndim = max(len(shape) + ndim_delta, -(2**31))
    p = Producer(
        shape=shape,
        strides=strides,
        ndim=ndim,
        null_shape=null_shape,
        device=device,
        capsule_device=capsule_device,
        dtype=dtype,
        data=data,
        byte_offset=byte_offset,
        name=name,
    )
    try:
        m = meta(p)
    except b12x.B12xError:
        return
    # read means read faithfully (a lying ndim one past the shape reads a spare 0)
    assert m.shape == [*shape, 0][:ndim]
    assert (m.data_ptr, m.byte_offset) == (data, byte_offset)
    if strides is not None and ndim > 0:
        assert m.strides == strides[:ndim]
