"""Limits and environment knobs of the IPC all-reduce.

The rules live in b12x-core (``allreduce::limits`` and ``allreduce::knobs``);
this module names them for Python. Every value is checked where it is read:
a garbage value is a :class:`b12x.errors.ConfigError` (a ValueError) that
names the argument or variable and the accepted form.

Limits (inclusive byte ceilings, spec §5.1 grammar: ``17``, ``84KB``,
``6 MiB``, ``2g``; ``KB`` is KiB; at most 1 TiB) come from the constructor or
the environment:

=====================================  ==========  ===========================================
variable                               default     meaning
=====================================  ==========  ===========================================
``B12X_ALLREDUCE_ONESHOT_MAX_SIZE``    512 KiB     plain one-shot ceiling; 0: off
``B12X_ALLREDUCE_FUSED_MAX_SIZE``      512 KiB     fused ceiling; 0: off
``B12X_ALLREDUCE_TWOSHOT_MAX_SIZE``    32 MiB      bf16 two-shot ceiling; off/0
``B12X_ALLREDUCE_TWOSHOT_ROW_ELEMS``   4096        two-shot needs numel % (world * row_elems)
                                                   == 0
``B12X_ALLREDUCE_TIMEOUT_S``           60          bound of every cross-GPU wait, seconds in
                                                   (0, 3600]
``B12X_ALLREDUCE_TWOSHOT_PUSH``        auto        two-shot transport: 1 push, 0 pull, auto:
                                                   push iff every pair has native P2P
                                                   atomics (NVLink), else pull (PCIe)
=====================================  ==========  ===========================================

The four ceilings were named ``VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE``,
``VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE``,
``VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE`` and ``VLLM_PCIE_TWOSHOT_ROW_ELEMS``
(:data:`DEPRECATED`): vLLM warns about every ``VLLM_*`` variable it does not
know, and refuses to start when its environment check is strict. An old name
is still read where the new one is unset, with one warning naming the new
one.

``B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK`` (a rank) is a test hook: that rank
fails its slab allocation, which proves one rank's set-up failure disables
the runtime on every rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from b12x import _core

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "DEPRECATED",
    "ENV_FAIL_SETUP_RANK",
    "ENV_FUSED_MAX",
    "ENV_ONESHOT_MAX",
    "ENV_TIMEOUT",
    "ENV_TWOSHOT_MAX",
    "ENV_TWOSHOT_PUSH",
    "ENV_TWOSHOT_ROW_ELEMS",
    "Limits",
    "fail_setup_rank",
    "parse_byte_size",
    "timeout_ns",
    "twoshot_push",
]

ENV_ONESHOT_MAX: Final = _core.ALLREDUCE_ENV["oneshot_max"]
ENV_FUSED_MAX: Final = _core.ALLREDUCE_ENV["fused_max"]
ENV_TWOSHOT_MAX: Final = _core.ALLREDUCE_ENV["twoshot_max"]
ENV_TWOSHOT_ROW_ELEMS: Final = _core.ALLREDUCE_ENV["twoshot_row_elems"]
ENV_TIMEOUT: Final = _core.ALLREDUCE_ENV["timeout_s"]
ENV_TWOSHOT_PUSH: Final = _core.ALLREDUCE_ENV["twoshot_push"]
ENV_FAIL_SETUP_RANK: Final = _core.ALLREDUCE_ENV["fail_setup_rank"]
#: Deprecated variable name -> the name that replaced it.
DEPRECATED: Final = dict(_core.ALLREDUCE_ENV_DEPRECATED)
DEFAULT_TIMEOUT_S: Final = _core.ALLREDUCE_DEFAULT_TIMEOUT_S

#: Inclusive byte ceilings of each route (b12x-core's struct): ``Limits()``
#: are the defaults, ``Limits.from_env(env)`` reads the knobs above.
Limits = _core.Limits


def parse_byte_size(text: str) -> int:
    """Parse a byte size: ``"17"`` -> 17, ``"84KB"`` -> 86016, ``"6 MiB"`` -> 6291456.

    Suffixes b, k/kb/kib, m/mb/mib, g/gb/gib, t/tb/tib (case-insensitive; KB is
    KiB). Raises :class:`b12x.errors.ConfigError` (a ValueError) on a bad suffix
    ("invalid byte-size suffix") or text that is no size ("invalid byte size").
    """
    return _core.allreduce_parse_byte_size(text)


def timeout_ns(timeout_s: float | None, env: Mapping[str, str] | None = None) -> int:
    """The wait bound in nanoseconds: ``timeout_s`` seconds, or when None
    ``B12X_ALLREDUCE_TIMEOUT_S`` (default 60). Finite, above 0, at most 3600 s."""
    return _core.allreduce_timeout_ns(timeout_s, env)


def twoshot_push(choice: bool | None, env: Mapping[str, str] | None = None) -> bool | None:
    """The two-shot transport: ``choice``, or when None ``B12X_ALLREDUCE_TWOSHOT_PUSH``
    (0, 1 or auto). None means auto: decided collectively at set-up."""
    return _core.allreduce_twoshot_push(choice, env)


def fail_setup_rank(env: Mapping[str, str] | None = None) -> int | None:
    """The rank the set-up test hook fails, if ``B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK`` is set."""
    return _core._allreduce_fail_setup_rank(env)
