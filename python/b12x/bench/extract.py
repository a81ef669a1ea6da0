"""Tensor-metadata extraction cost: b12x's torch path vs torch's __dlpack__ path."""

from __future__ import annotations

import argparse

from b12x import _core
from b12x._cli_args import positive_int
from b12x.bench.common import BenchResult, time_per_call_us


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--number", type=positive_int, default=20000, help="calls per sample")
    p.add_argument("--repeats", type=positive_int, default=5, help="samples per arm")


def run(args: argparse.Namespace) -> BenchResult:
    import torch

    result = BenchResult("extract", {"number": args.number, "repeats": args.repeats})
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        t = torch.empty((64, 16, 128), dtype=torch.uint8, device=device)
        case = f"torch_{device}"
        n, r = args.number, args.repeats
        arms = {
            # extract + one small result object; the same extraction every bind uses
            "b12x_torch_path": lambda t=t: _core.tensor_meta(t),
            "b12x_dlpack_path": lambda t=t: _core._tensor_meta_dlpack(t),
            # extract + byte-extent check, returning an int (no result object)
            "b12x_validate": lambda t=t: _core._validate_operand(t, "x"),
            "torch_dunder_dlpack_only": lambda t=t: t.__dlpack__(),
            "python_attrs": lambda t=t: (t.dtype, t.device, t.shape, t.stride(), t.data_ptr()),
        }
        for arm, fn in arms.items():
            result.add(case, arm, time_per_call_us(fn, n, r))
        fast = result.median(case, "b12x_torch_path")
        result.notes.append(
            f"{case}: torch path {fast:.3f} us vs DLPack path "
            f"{result.median(case, 'b12x_dlpack_path'):.3f} us per tensor"
        )
    try:
        import numpy as np

        a = np.empty((64, 16, 128), dtype=np.uint8)
        result.add(
            "numpy",
            "b12x_dlpack_path",
            time_per_call_us(lambda: _core.tensor_meta(a), args.number, args.repeats),
        )
    except ImportError:
        pass
    return result
