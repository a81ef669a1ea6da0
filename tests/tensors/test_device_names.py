"""One grammar of device strings (b12x-core's DeviceName) behind every Python
entry point that reads one: the CLI's --device and AllReduce(device=...)."""

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


# AllReduce trims surrounding whitespace first (" cuda" is torch's current device there)
@pytest.mark.parametrize("text", ["cpu", *(t for t in NOT_NAMES if t == t.strip())])
def test_allreduce_refuses_what_is_no_cuda_name(text):
    with pytest.raises(DeviceError):
        cuda_device(text)
