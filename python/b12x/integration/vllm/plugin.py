"""b12x's vLLM plugin (entry point ``vllm.general_plugins``: ``b12x``).

vLLM calls :func:`register` in each of its processes. It does nothing unless
the one switch, the environment variable ``B12X_VLLM``, asks for it:

==============================================  ======================================
``B12X_VLLM``                                   what vLLM gets
==============================================  ======================================
unset, ``""``, ``0``, ``off``, ``false``, ``no``  stock vLLM (the default)
``1``, ``on``, ``true``, ``yes``, ``all``       everything below
``allreduce``                                   b12x's all-reduce in vLLM's custom
                                                all-reduce slot, and the fused
                                                all-reduce + add + RMSNorm op
``indexer``                                     b12x's sparse indexer for DeepSeek
                                                V3.2 / V4 through vLLM's class hooks
``allreduce,indexer``                           both (a comma list, any order)
==============================================  ======================================

Case and spaces do not matter; anything else stops vLLM with a
:class:`b12x.ConfigError` naming ``B12X_VLLM``. Whatever the switch says,
:func:`register` tells vLLM's detection of the public ``b12x`` package
(GEMM / MoE / attention for SM120, ``vllm[b12x]``) that it is absent: this
b12x has the same import name but none of that code. ``b12x doctor`` shows
the plugin's state (:func:`status`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from typing import Any

from b12x.errors import ConfigError

__all__ = [
    "COMPONENTS",
    "ENTRY_POINT",
    "ENV",
    "enabled_components",
    "parse_switch",
    "register",
    "status",
    "status_lines",
]

logger = logging.getLogger(__name__)

ENV = "B12X_VLLM"
ENTRY_POINT = "b12x.integration.vllm.plugin:register"
INDEXER_HOOKS = "b12x.integration.vllm.indexer_hooks"
COMPONENTS = {
    "allreduce": "all-reduce in vLLM's custom all-reduce slot (declared shapes; others as stock)"
    " + torch.ops.b12x.fused_all_reduce_add_rms_norm",
    "indexer": "sparse indexer for DeepSeek V3.2 / V4 through vLLM's indexer hooks",
}
_OFF = {"", "0", "off", "false", "no"}
_ALL = {"1", "on", "true", "yes", "all"}


def parse_switch(value: str | None) -> frozenset[str]:
    """The components a ``B12X_VLLM`` value turns on (empty: off).

    Raises
    ------
    b12x.ConfigError
        (a ValueError) For a value that is none of the documented ones.
    """
    text = (value or "").strip().lower()
    if text in _OFF:
        return frozenset()
    if text in _ALL:
        return frozenset(COMPONENTS)
    names = [part.strip() for part in text.split(",")]
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise ConfigError(
            f"{ENV}: value expected one of 0/off, 1/on/all or a comma list of "
            f"{', '.join(COMPONENTS)}, got {value!r}"
        )
    return frozenset(names)


def enabled_components(env: Mapping[str, str] | None = None) -> frozenset[str]:
    """:func:`parse_switch` of ``B12X_VLLM`` in ``env`` (default ``os.environ``)."""
    return parse_switch((os.environ if env is None else env).get(ENV))


def register() -> None:
    """vLLM's plugin hook: installs what ``B12X_VLLM`` asks for; safe to call again.

    Raises
    ------
    b12x.ConfigError
        If ``B12X_VLLM`` holds an undocumented value (vLLM then stops).
    """
    hide_from_vllm_b12x_detection()
    components = enabled_components()
    if not components:
        logger.debug("b12x vLLM plugin off (%s unset or off)", ENV)
        return
    if "allreduce" in components:
        from b12x.integration.vllm import communicator, fused_op  # noqa: F401 (registers the op)

        communicator.install()
    if "indexer" in components:
        _install_indexer()
    logger.info("b12x vLLM plugin on: %s", ", ".join(sorted(components)))


def _install_indexer() -> bool:
    """Calls the indexer hooks' ``install`` if this b12x has them."""
    if importlib.util.find_spec(INDEXER_HOOKS) is None:
        logger.warning("b12x vLLM plugin: this b12x has no indexer hooks (%s)", INDEXER_HOOKS)
        return False
    from vllm.config import get_current_vllm_config_or_none

    installed = bool(
        importlib.import_module(INDEXER_HOOKS).install(
            vllm_config=get_current_vllm_config_or_none()
        )
    )
    if not installed:
        logger.warning("b12x vLLM plugin: the indexer hooks declined to install")
    return installed


def hide_from_vllm_b12x_detection() -> None:
    """Makes ``vllm.utils.b12x.has_b12x()`` False: the public b12x is not installed.

    vLLM detects the public ``b12x`` (``vllm[b12x]``) with
    ``importlib.util.find_spec("b12x")``, which finds this package. Its
    submodule getters already return None here (none of those modules
    exists in this b12x), so no backend selects missing code; this makes the
    flag agree with them (an entry of the patch table).
    """
    from b12x.integration.vllm import patches

    try:
        patches.install("plugin")
    except ImportError:  # a vLLM without that detection
        return


def status(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plugin's state for ``b12x doctor``; never raises, never imports vLLM.

    Keys: ``entry_point`` (whether the installed b12x registers it with
    vLLM), ``vllm`` (installed vLLM version or None), ``switch`` (the raw
    ``B12X_VLLM``), ``components`` (sorted names it turns on) or ``error``,
    ``would_enable`` (what each turns on), ``indexer_hooks`` (whether this
    b12x has them), ``active`` (this process: ``allreduce_installed``,
    ``live_slots``).
    """
    import importlib.metadata as metadata
    import sys

    env = os.environ if env is None else env
    info: dict[str, Any] = {"switch": env.get(ENV)}
    try:
        points = metadata.entry_points(group="vllm.general_plugins")
        info["entry_point"] = any(p.value == ENTRY_POINT for p in points)
    except Exception:
        info["entry_point"] = False
    try:
        info["vllm"] = metadata.version("vllm")
    except metadata.PackageNotFoundError:
        info["vllm"] = None
    try:
        components = sorted(parse_switch(info["switch"]))
        info["components"] = components
        info["would_enable"] = {name: COMPONENTS[name] for name in components}
    except ConfigError as e:
        info["error"] = str(e)
        info["components"] = []
        info["would_enable"] = {}
    try:
        info["indexer_hooks"] = importlib.util.find_spec(INDEXER_HOOKS) is not None
    except Exception:
        info["indexer_hooks"] = False
    active: dict[str, Any] = {"allreduce_installed": False, "live_slots": 0}
    if "b12x.integration.vllm.communicator" in sys.modules:
        from b12x.integration.vllm import communicator

        active["allreduce_installed"] = communicator.installed()
        active["live_slots"] = len(communicator.live_slots())
    info["active"] = active
    return info


def status_lines(state: Mapping[str, Any]) -> list[tuple[str, str]]:
    """:func:`status` as ``b12x doctor`` prints it: ``(label, text)`` rows."""
    vllm = state.get("vllm") or "not installed"
    registered = "registered" if state.get("entry_point") else "NOT registered (reinstall b12x)"
    rows = [("vLLM plugin", f"entry point {registered}; vLLM {vllm}")]
    switch = state.get("switch")
    shown = "unset" if switch is None else repr(switch)
    if "error" in state:
        return [*rows, (ENV, f"{shown}: {state['error']}")]
    if not state.get("components"):
        return [*rows, (ENV, f"{shown}: off, vLLM runs as stock")]
    rows.append((ENV, f"{shown}: on; vLLM gets:"))
    for name, what in state.get("would_enable", {}).items():
        missing = name == "indexer" and not state.get("indexer_hooks")
        rows.append((f"  {name}", what + (" (not in this b12x)" if missing else "")))
    return rows
