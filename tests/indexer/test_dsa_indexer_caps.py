"""dsa_indexer.Caps: validation matrix, device forms, value semantics."""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x.attention import dsa_indexer as di

BASE = {
    "device": "cpu",
    "num_q_heads": 64,
    "max_q_rows": 16,
    "max_page_table_width": 1024,
    "topk": 512,
}


def caps(**kw):
    return di.Caps(**{**BASE, **kw})


def test_fields_and_defaults():
    c = caps()
    assert c.device == torch.device("cpu")
    assert (c.num_q_heads, c.max_q_rows, c.max_page_table_width, c.topk) == (64, 16, 1024, 512)
    assert (c.mode, c.output_index_space, c.page_size, c.supertile_tokens) == (
        "decode",
        "logical",
        64,
        0,
    )
    assert di.PAGED_INDEX_PAGE_SIZE == c.page_size == 64
    assert di.INDEX_HEAD_DIM == 128


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("num_q_heads", 0, r"an integer in \[1, 64\], got 0"),
        ("num_q_heads", 65, r"an integer in \[1, 64\], got 65"),
        ("num_q_heads", -4, r"an integer in \[1, 64\], got -4"),
        ("max_q_rows", 0, r"an integer in \[1, 1048576\], got 0"),
        ("max_q_rows", 2**20 + 1, r"an integer in \[1, 1048576\], got 1048577"),
        ("max_page_table_width", 0, r"an integer in \[1, 16777216\], got 0"),
        ("max_page_table_width", 2**24 + 1, r"an integer in \[1, 16777216\], got 16777217"),
        ("topk", 4, r"one of \{512, 1024, 2048\} .*, got 4$"),
        ("topk", 256, r"one of \{512, 1024, 2048\} .*, got 256$"),
        ("topk", 4096, r"one of \{512, 1024, 2048\} .*, got 4096$"),
        ("mode", "chunked", r"one of \{decode, prefill\}, got \"chunked\"$"),
        ("output_index_space", "global", r"one of \{logical, physical\}, got \"global\"$"),
        ("page_size", 32, r"64 \(compressed K rows per FP8 cache page\), got 32$"),
        ("supertile_tokens", 1000, r"0 \(automatic\) or a multiple of 512 in .*, got 1000$"),
        ("supertile_tokens", 256, r"0 \(automatic\) or a multiple of 512 in .*, got 256$"),
        ("supertile_tokens", 65536 + 512, r"0 \(automatic\) .* \[512, 65536\], got 66048$"),
    ],
)
def test_each_bad_field_is_a_config_error_naming_it(field, value, expected):
    with pytest.raises(b12x.ConfigError, match=rf"^Caps: {field} expected {expected}") as e:
        caps(**{field: value})
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("topk", [512, 1024, 2048])
@pytest.mark.parametrize("heads", [1, 16, 17, 64])
def test_supported_values_are_accepted(topk, heads):
    c = caps(topk=topk, num_q_heads=heads, mode="prefill", output_index_space="physical")
    assert (c.topk, c.num_q_heads, c.mode, c.output_index_space) == (
        topk,
        heads,
        "prefill",
        "physical",
    )


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("cpu", torch.device("cpu")),
        (torch.device("cpu"), torch.device("cpu")),
    ],
)
def test_device_forms(device, expected):
    assert caps(device=device).device == expected


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("device", "expected"),
    [
        ("cuda:0", torch.device("cuda", 0)),
        (torch.device("cuda", 0), torch.device("cuda", 0)),
        (0, torch.device("cuda", 0)),
        ("cuda", None),  # torch's current device
    ],
)
def test_cuda_device_forms(device, expected):
    # a CUDA device must exist (tests/indexer/test_caps_strict.py has the refusals)
    expected = expected or torch.device("cuda", torch.cuda.current_device())
    assert caps(device=device).device == expected


@pytest.mark.parametrize(
    ("device", "expected"),
    [
        (torch.device("mps"), r"b12x runs on cpu and cuda, not mps"),
        ("mps", r"Caps: device expected a torch.device, 'cpu', 'cuda'"),
        ("nonsense", r"Caps: device expected a torch.device, 'cpu', 'cuda' \(the current"),
        (-1, r"Caps: device expected .* got -1"),
    ],
)
def test_bad_devices(device, expected):
    with pytest.raises(b12x.DeviceError, match=expected):
        caps(device=device)


def test_keyword_only_and_required():
    with pytest.raises(TypeError):
        di.Caps("cpu", 64, 16, 1024, 512)
    with pytest.raises(TypeError, match="topk"):
        di.Caps(device="cpu", num_q_heads=64, max_q_rows=16, max_page_table_width=1024)


def test_frozen_equal_hashable():
    a, b = caps(), caps()
    assert a == b and hash(a) == hash(b) and a is not b
    assert caps(topk=1024) != a
    assert caps(max_q_rows=17) != a
    assert a != "caps"
    assert len({a, b, caps(mode="prefill")}) == 2
    with pytest.raises(AttributeError):
        a.topk = 1024


def test_caps_carry_no_route_or_source_layout_fields():
    # the vLLM adapter's contract test asserts Caps take neither
    c = caps()
    for name in ("route", "source_layout", "shared_page_table"):
        assert not hasattr(c, name)
    with pytest.raises(TypeError):
        caps(source_layout="paged")


def test_repr_lists_every_field():
    r = repr(caps(mode="prefill"))
    assert r.startswith("Caps(device=cpu, num_q_heads=64, max_q_rows=16")
    assert "mode=prefill" in r and "supertile_tokens=0" in r
