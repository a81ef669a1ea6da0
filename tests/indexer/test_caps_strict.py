"""dsa_indexer.Caps refuses what it used to accept or mangle: bools as numbers
or devices, huge ints, non-strings, ordinals torch cannot represent or that do
not exist. Every refusal is a B12xError naming the field."""

from __future__ import annotations

import b12x
import numpy as np
import pytest
import torch
from b12x.attention import dsa_indexer as di
from test_dsa_indexer_caps import caps

INT_FIELDS = [
    "num_q_heads",
    "max_q_rows",
    "max_page_table_width",
    "topk",
    "page_size",
    "supertile_tokens",
]


@pytest.mark.parametrize("field", INT_FIELDS)
@pytest.mark.parametrize("value", [True, False, 64.0, "64", [64]])
def test_int_fields_take_integers_only(field, value):
    with pytest.raises(b12x.ConfigError) as e:
        caps(**{field: value})
    assert str(e.value) == f"Caps: {field} expected an integer, got {value!r}"


@pytest.mark.parametrize("field", INT_FIELDS[:4])
def test_required_int_fields_are_not_none(field):
    with pytest.raises(b12x.ConfigError, match=rf"^Caps: {field} expected an integer, got None$"):
        caps(**{field: None})


@pytest.mark.parametrize(
    ("field", "range_text"),
    [
        ("num_q_heads", r"an integer in \[1, 64\]"),
        ("max_q_rows", r"an integer in \[1, 1048576\]"),
        ("max_page_table_width", r"an integer in \[1, 16777216\]"),
        ("topk", r"one of \{512, 1024, 2048\} .*"),
        ("page_size", r"64 \(compressed K rows per FP8 cache page\)"),
        ("supertile_tokens", r"0 \(automatic\) or a multiple of 512 in \[512, 65536\]"),
    ],
)
@pytest.mark.parametrize("value", [2**63, 10**30, -(2**63) - 1, -(10**40)])
def test_huge_ints_get_the_fields_range_error_not_an_overflow(field, range_text, value):
    with pytest.raises(b12x.ConfigError, match=rf"^Caps: {field} expected {range_text}, got ") as e:
        caps(**{field: value})
    assert str(e.value).endswith(f"got {value}")
    assert not isinstance(e.value, OverflowError)


def test_integer_likes_are_accepted():
    c = caps(num_q_heads=np.int64(16), max_q_rows=np.int32(4), topk=np.int16(512))
    assert (c.num_q_heads, c.max_q_rows, c.topk) == (16, 4, 512)


@pytest.mark.parametrize("field", ["mode", "output_index_space"])
@pytest.mark.parametrize("value", [1, True, b"decode", ["decode"]])
def test_string_fields_take_strings_only(field, value):
    with pytest.raises(b12x.ConfigError, match=rf"^Caps: {field} expected a string, got "):
        caps(**{field: value})


def test_omitted_and_none_defaults_agree():
    assert caps() == caps(mode=None, output_index_space=None, page_size=None, supertile_tokens=None)


@pytest.mark.parametrize("device", [True, False, np.True_])
def test_a_bool_is_not_a_device(device):
    with pytest.raises(b12x.DeviceError, match=r"^Caps: device expected a torch.device"):
        caps(device=device)


@pytest.mark.parametrize(
    ("device", "got"),
    [
        ("cuda:128", "128"),
        ("cuda:300", "300"),  # torch.device("cuda:300") is cuda:44
        (300, "300"),
        (-1, "-1"),
        (2**40, str(2**40)),
        (torch.device("cuda:128"), "-128"),  # torch already wrapped it
    ],
)
def test_ordinals_torch_cannot_represent_are_refused(device, got):
    with pytest.raises(
        b12x.DeviceError,
        match=rf"^Caps: device expected a CUDA ordinal in \[0, 127\] \(torch's device index is "
        rf"int8\), got {got}$",
    ):
        caps(device=device)


@pytest.mark.parametrize("device", [2**64, -(2**70), "cuda:99999999999999999999"])
def test_ordinals_past_64_bits_are_refused(device):
    with pytest.raises(b12x.DeviceError, match=r"^Caps: device expected "):
        caps(device=device)


@pytest.mark.parametrize("form", ["str", "int", "torch.device"])
def test_ordinals_past_the_visible_devices_are_refused(form):
    n = torch.cuda.device_count()
    device = {"str": f"cuda:{n}", "int": n, "torch.device": torch.device("cuda", n)}[form]
    with pytest.raises(
        b12x.DeviceError,
        match=rf"^Caps: device expected a CUDA device this process can see \({n} visible\), got ",
    ):
        caps(device=device)


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks the no-GPU path")
@pytest.mark.parametrize("device", ["cuda", torch.device("cuda"), "cuda:0", 0])
def test_cuda_without_a_gpu_is_a_b12x_error_not_torchs_runtime_error(device):
    with pytest.raises(b12x.DeviceError, match=r"this process can see \(0 visible\), got "):
        caps(device=device)


@pytest.mark.parametrize("device", ["cuda:0:1", "cuda:", "cuda:-1", " cuda", "CUDA", "tpu"])
def test_malformed_device_strings_are_device_errors(device):
    with pytest.raises(b12x.DeviceError, match=r"^Caps: device expected a torch.device, 'cpu'"):
        caps(device=device)


@pytest.mark.gpu
def test_caps_device_and_plan_key_agree():
    last = torch.cuda.device_count() - 1
    for device in (f"cuda:{last}", last, torch.device("cuda", last)):
        c = caps(device=device)
        assert c.device == torch.device("cuda", last)
        assert repr(c).startswith(f"Caps(device=cuda:{last},")
        assert di.plan(c).device == c.device
