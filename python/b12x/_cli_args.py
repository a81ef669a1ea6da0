"""argparse ``type=`` helpers shared by ``b12x`` and its benchmarks.

A value outside what a command can use is a usage error: argparse prints
``b12x ...: error: argument --NAME: expected ..., got ...`` and exits 2 before
any work starts. :class:`Unavailable` is the runtime counterpart: this
machine cannot run the command (too few GPUs); the CLI prints it as one line
and exits 1.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from b12x import _core


class Unavailable(RuntimeError):
    """This machine cannot run the command (e.g. it has fewer GPUs than asked for)."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    """An integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}")
        return value

    parse.__name__ = f"integer >= {minimum}"  # argparse names the type in some messages
    return parse


positive_int = int_at_least(1)
non_negative_int = int_at_least(0)


def device(text: str) -> str:
    """'cpu', 'cuda' (torch's current device) or 'cuda:N' with N <= 127
    (b12x-core's device grammar)."""
    if _core.parse_device_name(text) is None:
        raise argparse.ArgumentTypeError(
            f"expected cpu, cuda or cuda:N (N <= {_core.MAX_CUDA_ORDINAL}), got {text!r}"
        )
    return text


def indexer_topk(text: str) -> int:
    """A top-k the indexer's selection kernels are built for."""
    from b12x.attention.dsa_indexer import SUPPORTED_TOPK

    accepted = ", ".join(map(str, SUPPORTED_TOPK))
    try:
        value = int(text)
    except ValueError:
        value = None
    if value not in SUPPORTED_TOPK:
        raise argparse.ArgumentTypeError(f"expected one of {accepted}, got {text!r}")
    return value


def output_file(text: str) -> str:
    """A file path that can be written: its directory exists and is writable."""
    path = Path(text)
    parent = path.parent
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file path, got the directory {text!r}")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"expected a file in an existing directory, got {text!r} ({str(parent)!r} does not "
            "exist)"
        )
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"expected a writable file, got {text!r}")
    return text


def require_gpus(needed: Callable[[argparse.Namespace], int]) -> Callable[..., None]:
    """A preflight check for ``parser.set_defaults(preflight=...)``: raises
    :class:`Unavailable` when torch sees fewer CUDA devices than ``needed(args)``."""

    def check(args: argparse.Namespace) -> None:
        import torch

        want, found = needed(args), torch.cuda.device_count()
        if found < want:
            raise Unavailable(f"needs {want} GPUs, this machine has {found}")

    return check
