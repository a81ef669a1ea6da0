"""Byte limits of the PCIe all-reduce routes, from vLLM's environment knobs.

* ``VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE`` (default ``84KB``): the plain
  one-shot ceiling, inclusive; 0 turns plain one-shot off.
* ``VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE`` (default ``84KB``): the fused
  all-reduce + add + RMSNorm ceiling, independent of the plain one.
* ``VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE`` (default off): the bf16 two-shot
  ceiling; ``""``, ``0``, ``off``, ``none`` and ``disabled`` mean off.
* ``VLLM_PCIE_TWOSHOT_ROW_ELEMS`` (default 4096): the two-shot row width in elements.

Sizes use the byte-size grammar: digits with an optional ``b``, ``k``/``kb``/``kib``,
``m``..., ``g``..., ``t``... suffix, case-insensitive, where KB means KiB
("84KB" is 86016). An explicit knob always wins over a default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from b12x.errors import ConfigError

__all__ = ["Limits", "parse_byte_size"]

ONESHOT_MAX_ENV = "VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE"
FUSED_MAX_ENV = "VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE"
TWOSHOT_MAX_ENV = "VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE"
TWOSHOT_ROW_ELEMS_ENV = "VLLM_PCIE_TWOSHOT_ROW_ELEMS"

_DEFAULT_ONESHOT_MAX = "84KB"
_DEFAULT_FUSED_MAX = "84KB"
_DEFAULT_TWOSHOT_ROW_ELEMS = 4096
_OFF = frozenset({"", "0", "off", "none", "disabled"})
_BF16_BYTES = 2

# TODO(collectives): remove this private copy once b12x.comm.pcie exposes the
# Rust parser (rust/core allreduce::bytesize); parse_byte_size() prefers it.
_SIZE = re.compile(r"\s*([+-]?)(\d+)\s*([a-z]*)\s*")
_UNITS = {
    "": 1,
    "b": 1,
    **{s: 1 << 10 for s in ("k", "kb", "kib")},
    **{s: 1 << 20 for s in ("m", "mb", "mib")},
    **{s: 1 << 30 for s in ("g", "gb", "gib")},
    **{s: 1 << 40 for s in ("t", "tb", "tib")},
}


def _parse_byte_size_fallback(text: str) -> int:
    match = _SIZE.fullmatch(text.lower())
    if match is None:
        raise ConfigError(f"parse_byte_size: value expected a byte size such as 84KB, got {text!r}")
    sign, digits, suffix = match.groups()
    unit = _UNITS.get(suffix)
    if unit is None:
        raise ConfigError(
            f"parse_byte_size: value expected a byte-size suffix among b, k/kb/kib, m/mb/mib, "
            f"g/gb/gib, t/tb/tib, got {text!r}"
        )
    return (-1 if sign == "-" else 1) * int(digits) * unit


def parse_byte_size(text: str) -> int:
    """Bytes in ``text`` ("17", "84KB", "6 MiB", "2g"); signed, so callers reject negatives.

    Raises
    ------
    ValueError
        (b12x.errors.ConfigError) On anything else.
    """
    try:
        from b12x.comm.pcie import parse_byte_size as library_parse
    except ImportError:
        return _parse_byte_size_fallback(text)
    return int(library_parse(text))


def _size(env: Mapping[str, str], name: str, default: str) -> int:
    text = env.get(name)
    value = parse_byte_size(default if text is None else text)
    if value < 0:
        raise ConfigError(f"PcieAllReduce: {name} expected a size >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class Limits:
    """Inclusive byte ceilings of each route (0 = route off) and the two-shot row width.

    ``twoshot_max`` is already rounded down to whole two-shot row groups
    (rows a multiple of the world size), as the kernel partitions them.
    """

    oneshot_max: int
    fused_max: int
    twoshot_max: int = 0
    twoshot_row_elems: int = _DEFAULT_TWOSHOT_ROW_ELEMS

    @property
    def buffer_bytes(self) -> int:
        """Bytes one one-shot staging slot must hold."""
        return max(self.oneshot_max, self.fused_max, 16)

    @classmethod
    def from_env(cls, world_size: int, env: Mapping[str, str] | None = None) -> Limits:
        """Reads the knobs (see the module docstring) for a group of ``world_size`` ranks.

        Raises
        ------
        b12x.errors.ConfigError
            On a malformed or negative size, or a non-positive row width.
        """
        env = os.environ if env is None else env
        oneshot = _size(env, ONESHOT_MAX_ENV, _DEFAULT_ONESHOT_MAX)
        fused = _size(env, FUSED_MAX_ENV, _DEFAULT_FUSED_MAX)
        row_text = env.get(TWOSHOT_ROW_ELEMS_ENV)
        row_elems = _DEFAULT_TWOSHOT_ROW_ELEMS if row_text is None else int(row_text)
        if row_elems <= 0:
            raise ConfigError(
                f"PcieAllReduce: {TWOSHOT_ROW_ELEMS_ENV} expected > 0, got {row_text!r}"
            )
        twoshot_text = env.get(TWOSHOT_MAX_ENV, "")
        twoshot = 0
        if twoshot_text.strip().lower() not in _OFF:
            requested = _size(env, TWOSHOT_MAX_ENV, "0")
            rows = requested // (row_elems * _BF16_BYTES)
            rows -= rows % max(world_size, 1)
            # Fewer rows than ranks leaves a rank without a shard: two-shot off.
            twoshot = rows * row_elems * _BF16_BYTES if rows >= world_size else 0
        return cls(oneshot, fused, twoshot, row_elems)
