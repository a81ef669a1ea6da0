"""One grammar of devices (b12x-core's DeviceName for strings) behind every
Python entry point that reads one: the CLI's --device, AllReduce(device=...),
Caps(device=...), dsa_indexer.is_supported / check, b12x.cuda."""

from __future__ import annotations

import argparse

import pytest
import torch
from b12x import DeviceError, _cli_args, _core
from b12x.comm.pcie.handshake import cuda_device

NAMES = ["cpu", "cuda", "cuda:0", "cuda:7", "cuda:007", "cuda:127"]
NOT_NAMES = ["cuda:128", "cuda:300", "cuda:-1", "cuda:1.5", "cuda:", "gpu0", "", " cuda", "CPU"]


@pytest.mark.parametrize("text", NAMES)
def test_device_names_parse(text):
    kind, ordinal = _core.parse_device_name(text)
    assert kind == text.split(":")[0]
    assert ordinal == (int(text.split(":")[1]) if ":" in text else None)
    assert _cli_args.device(text) == text


@pytest.mark.parametrize("text", NOT_NAMES)
def test_other_strings_are_no_device(text):
    assert _core.parse_device_name(text) is None
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected cpu, cuda or cuda:N"):
        _cli_args.device(text)


def test_the_ordinal_bound_is_torchs_int8():
    assert _core.MAX_CUDA_ORDINAL == 127


@pytest.mark.parametrize("text", [n for n in NAMES if n.startswith("cuda:")])
def test_allreduce_reads_the_same_cuda_names(text):
    assert cuda_device(text) == torch.device("cuda", int(text.split(":")[1]))


@pytest.mark.parametrize("text", ["cpu", *NOT_NAMES])
def test_allreduce_refuses_what_is_no_cuda_name(text):
    with pytest.raises(DeviceError):
        cuda_device(text)


@pytest.mark.parametrize("entry", ["caps", "allreduce", "check", "resolve"])
@pytest.mark.parametrize("text", [" cuda", "cuda:x", "gpu0", "CPU"])
def test_every_entry_point_refuses_the_same_strings_with_the_same_words(entry, text):
    from b12x.attention import dsa_indexer as di

    calls = {
        "caps": lambda: di.Caps(
            device=text, num_q_heads=8, max_q_rows=1, max_page_table_width=1, topk=512
        ),
        "allreduce": lambda: cuda_device(text),
        "check": lambda: di.check(text),
        "resolve": lambda: _core.resolve_device(text, "resolve"),
    }
    with pytest.raises(DeviceError, match=r"device expected a torch\.device, 'cpu', 'cuda' \(the"):
        calls[entry]()


def test_none_is_the_current_cuda_device_everywhere():
    from b12x import cuda

    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    assert _core.resolve_device(None, "x") == ("cuda", current)
    assert _core.resolve_device("cuda", "x") == ("cuda", current)
    assert cuda.device_index(None) == current == cuda_device(None).index
