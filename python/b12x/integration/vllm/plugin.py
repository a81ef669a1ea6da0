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
from b12x.integration.vllm._once import log_once

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

    With the switch on, b12x's loggers write through vLLM's own handlers
    (:func:`use_vllm_logging`) and one line says what is on and why the rest
    is not; with it off nothing is logged.

    Raises
    ------
    b12x.ConfigError
        If ``B12X_VLLM`` holds an undocumented value (vLLM then stops).
    """
    hide_from_vllm_b12x_detection()
    components = enabled_components()
    if not components:
        return
    use_vllm_logging()
    on: list[str] = []
    not_used: list[str] = []
    if "allreduce" in components:
        from b12x.integration.vllm import communicator, fused_op  # noqa: F401 (registers the op)

        communicator.install()
        on.append("allreduce")
    if "indexer" in components:
        why = _install_indexer()
        if why is None:
            on.append("indexer")
        else:
            not_used.append(f"indexer ({why})")
    text = ", ".join(on) if on else "nothing"
    if not_used:
        text += "; not used: " + "; ".join(not_used)
    logger.info("b12x vLLM plugin on: %s", text)
    _log_name_clash_once()


class _ToVllmLog(logging.Handler):
    """Hands each b12x record to vLLM's ``vllm`` logger, at vLLM's level: its
    handlers, format and stream, whenever (and however) vLLM configured them."""

    def emit(self, record: logging.LogRecord) -> None:
        target = logging.getLogger("vllm")
        if target.isEnabledFor(record.levelno):
            target.handle(record)


def use_vllm_logging() -> None:
    """Makes b12x's loggers write through vLLM's logging; idempotent.

    vLLM configures only its own ``vllm`` logger (``propagate`` off, handlers
    set when each process configures its logging), so without this b12x's
    lines reach no handler inside vLLM. Records still propagate to the root
    logger as before (vLLM's processes give it no handler). A b12x logger the
    application configured already is left alone.
    """
    ours = logging.getLogger("b12x")
    if ours.handlers:
        return
    ours.addHandler(_ToVllmLog())
    ours.setLevel(logging.DEBUG)  # vLLM's level decides, record by record


_NAME_CLASH = (
    "b12x: vLLM's messages that say 'Install the b12x backend with `pip install vllm[b12x]`' "
    "mean another package of the same name (GEMM, MoE and attention kernels for SM120); "
    "installing it replaces this b12x (both are the distribution 'b12x')"
)


def _log_name_clash_once() -> None:
    log_once(logger, logging.INFO, _NAME_CLASH)


def _install_indexer() -> str | None:
    """Calls the indexer hooks' ``install_reason``: None when they are in, else why not."""
    if importlib.util.find_spec(INDEXER_HOOKS) is None:
        return f"this b12x has no indexer hooks ({INDEXER_HOOKS})"
    from vllm.config import get_current_vllm_config_or_none

    hooks = importlib.import_module(INDEXER_HOOKS)
    return hooks.install_reason(vllm_config=get_current_vllm_config_or_none())


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


def vllm_loads_plugin(env: Mapping[str, str]) -> bool:
    """Whether vLLM loads b12x's plugin: ``VLLM_PLUGINS`` unset (every
    plugin), or a comma list that names ``b12x``. vLLM splits it on commas
    and strips nothing, so ``"a, b12x"`` does not name it."""
    allowed = env.get("VLLM_PLUGINS")
    return allowed is None or "b12x" in allowed.split(",")


def indexer_not_here() -> str | None:
    """Why no GPU of this machine would get b12x's indexer (none runs its
    kernels), or None where one does: ``b12x doctor``'s row for each GPU then
    gives the speed rule's decision there (:mod:`.speed_rule`)."""
    from b12x import _core, cuda
    from b12x.attention import dsa_indexer

    if cuda.is_available() and any(map(dsa_indexer.is_supported, range(_core.device_count()))):
        return None
    major, minor = _core.MIN_COMPUTE_CAPABILITY
    return f"no GPU here the indexer kernels run on (FP8 MMA needs sm_{major}{minor}+)"


def status(env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The plugin's state for ``b12x doctor``; never raises, never imports vLLM.

    Keys: ``entry_point`` (whether the installed b12x registers it with
    vLLM), ``vllm_plugins`` (the raw ``VLLM_PLUGINS``) and ``loaded`` (whether
    vLLM loads the plugin by it), ``vllm``
    (installed vLLM version or None), ``switch`` (the raw ``B12X_VLLM``),
    ``components`` (sorted names it turns on) or ``error``, ``would_enable``
    (what each turns on), ``indexer_hooks`` (whether this b12x has them),
    ``indexer_not_here`` (:func:`indexer_not_here`, when the switch asks for the indexer),
    ``active`` (this process: ``allreduce_installed``, ``live_slots``).
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
    info["loaded"] = vllm_loads_plugin(env)
    info["vllm_plugins"] = env.get("VLLM_PLUGINS")
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
    if "indexer" in info["components"]:
        try:
            info["indexer_not_here"] = indexer_not_here()
        except Exception as e:  # doctor reports, never fails
            info["indexer_not_here"] = f"could not check ({type(e).__name__}: {e})"
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
    plugin_row = f"entry point {registered}; vLLM {vllm}"
    if not state.get("loaded", True):
        plugin_row += (
            f"; NOT loaded: VLLM_PLUGINS={state.get('vllm_plugins')!r} does not name b12x"
            " (vLLM splits it on commas, spaces included)"
        )
    rows = [("vLLM plugin", plugin_row)]
    switch = state.get("switch")
    shown = "unset" if switch is None else repr(switch)
    if "error" in state:
        return [*rows, (ENV, f"{shown}: {state['error']}")]
    if not state.get("components"):
        return [*rows, (ENV, f"{shown}: off, vLLM runs as stock")]
    if not state.get("loaded", True):
        return [*rows, (ENV, f"{shown}: on, but vLLM does not load the plugin: vLLM runs as stock")]
    rows.append((ENV, f"{shown}: on; vLLM gets:"))
    for name, what in state.get("would_enable", {}).items():
        if name == "indexer" and not state.get("indexer_hooks"):
            rows.append((f"  {name}", what + " (not in this b12x)"))
            continue
        rows.append((f"  {name}", what))
        why_not = state.get("indexer_not_here") if name == "indexer" else None
        if why_not:
            rows.append(("    not used", why_not + "; vLLM's own indexer runs"))
    return rows
