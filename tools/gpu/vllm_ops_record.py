"""pytest plugin: which vLLM ops ran in this session, and which were asked for but absent.

Load it with ``-p vllm_ops_record`` (tools/gpu on PYTHONPATH; vllm_real.sh does).
From the start of the session it records

* every call of an op in a ``torch.ops`` namespace of vLLM's compiled libraries
  or of DeepGEMM (:data:`NAMESPACES`), by name, and every lookup of an op there
  that is not registered (a probe, or a call that then failed loudly);
* every launch of a Triton kernel defined in a ``vllm.*`` module (compile-only
  warm-ups not counted);
* the stand-in modules imported (``B12X_STAND_IN``, written by vllm_bundle.py).

and prints them at the end; ``VLLM_OPS_JSON=FILE`` writes them as JSON too. A
stand-in registers no op, so no op counted as run can be one of its; the
"absent" list names what the tested path asked a stand-in library for.
"""

from __future__ import annotations

import collections
import json
import os
import sys
from typing import Any

import pytest

# torch.ops namespaces the compiled libraries register (vLLM's and DeepGEMM's).
NAMESPACES = frozenset(
    {"_C", "_C_cache_ops", "_C_cuda_utils", "_C_custom_ar", "_moe_C", "_qutlass_C",
     "_rocm_C", "deep_select", "deep_gemm"}
)  # fmt: skip

CALLS: collections.Counter[str] = collections.Counter()
ABSENT: collections.Counter[str] = collections.Counter()
TRITON: collections.Counter[str] = collections.Counter()


class CountedOp:
    """An op packet that counts its calls; everything else is the packet's."""

    def __init__(self, packet: Any, name: str) -> None:
        self._packet = packet
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        CALLS[self._name] += 1
        return self._packet(*args, **kwargs)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._packet, attr)

    def __repr__(self) -> str:
        return f"CountedOp({self._packet!r})"


def _record_ops() -> None:
    from torch import _ops

    lookup = _ops._OpNamespace.__getattr__

    def counted_lookup(namespace: Any, op_name: str) -> Any:
        if namespace.name not in NAMESPACES or op_name.startswith("__"):
            return lookup(namespace, op_name)
        name = f"torch.ops.{namespace.name}.{op_name}"
        try:
            packet = lookup(namespace, op_name)
        except AttributeError:
            ABSENT[name] += 1
            raise
        op = CountedOp(packet, name)
        setattr(namespace, op_name, op)  # replaces the packet torch cached there
        return op

    _ops._OpNamespace.__getattr__ = counted_lookup  # type: ignore[method-assign]


def _record_triton() -> None:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:
        return
    run = JITFunction.run

    def counted_run(self: Any, *args: Any, grid: Any, warmup: bool, **kwargs: Any) -> Any:
        module = getattr(self.fn, "__module__", "") or ""
        if not warmup and module.startswith("vllm"):
            TRITON[f"{module}.{self.fn.__qualname__}"] += 1
        return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    JITFunction.run = counted_run  # type: ignore[method-assign]


def stand_ins() -> list[str]:
    # the module's own attribute: torch.ops and torch.classes answer any name
    return sorted(
        n
        for n, m in list(sys.modules.items())
        if getattr(m, "__dict__", {}).get("B12X_STAND_IN") is True
    )


def report() -> dict[str, Any]:
    return {
        "ops_called": dict(sorted(CALLS.items())),
        "ops_absent": dict(sorted(ABSENT.items())),
        "vllm_triton_kernels": dict(sorted(TRITON.items())),
        "stand_ins_imported": stand_ins(),
    }


def pytest_configure(config: pytest.Config) -> None:
    _record_ops()
    _record_triton()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    doc = report()
    write = terminalreporter.write_line
    terminalreporter.section("vLLM ops (tools/gpu/vllm_ops_record.py)")
    write("ran (compiled libraries and DeepGEMM, all real: a stand-in registers none):")
    for name, n in doc["ops_called"].items():
        write(f"  {name} x{n}")
    if not doc["ops_called"]:
        write("  none")
    write("vLLM Triton kernels launched:")
    for name, n in doc["vllm_triton_kernels"].items():
        write(f"  {name} x{n}")
    if not doc["vllm_triton_kernels"]:
        write("  none")
    write("looked up but not registered (absent here; a call of one fails its test):")
    for name, n in doc["ops_absent"].items():
        write(f"  {name} x{n}")
    if not doc["ops_absent"]:
        write("  none")
    write(f"stand-in modules imported: {', '.join(doc['stand_ins_imported']) or 'none'}")
    path = os.environ.get("VLLM_OPS_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
        write(f"wrote {path}")
