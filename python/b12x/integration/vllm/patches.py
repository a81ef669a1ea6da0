"""Every change b12x makes to vLLM, in one table, with one install and undo.

Each :class:`Patch` names the vLLM object it changes (``owner``, a dotted
module, or ``module:Class`` for a class attribute), what it changes
(``attribute``; for an out-of-tree registration the custom op's name), how
the replacement is made from vLLM's own value, and why. :func:`install`
applies a component's patches (idempotent) and keeps vLLM's values;
:func:`uninstall` puts them back; :func:`original` is vLLM's value while a
patch is in. Where vLLM has an extension point it is used: V3.2's
``SparseAttnIndexer`` is a ``CustomOp``, so b12x registers its class out of
tree (``CustomOp.register_oot``) instead of replacing vLLM's name.

vLLM is imported only by :func:`install` (and what it calls).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["PATCHES", "Patch", "install", "installed", "original", "uninstall"]

_SLOT = "vllm.distributed.device_communicators.custom_all_reduce"
_V32 = "vllm.models.deepseek_v32.attention"
_V4 = "vllm.models.deepseek_v4.attention"
_NOTHING = object()  # an attribute vLLM did not have


@dataclass(frozen=True)
class Patch:
    """One change to vLLM."""

    component: Literal["allreduce", "indexer", "plugin"]
    owner: str
    attribute: str
    #: ``make(vllm_value) -> b12x_value``
    make: Callable[[Any], Any]
    why: str
    kind: Literal["attribute", "oot"] = "attribute"


def _slot(_: Any) -> Any:
    from b12x.integration.vllm.communicator import B12xCustomAllreduce

    return B12xCustomAllreduce


def _v4_indexer_cls(vllm_method: Any) -> Any:
    from b12x.integration.vllm import indexer_backend, indexer_hooks

    return indexer_backend.make_v4_indexer_cls(vllm_method, indexer_hooks.accept)


def _v32_indexer_cls(vllm_value: Any) -> Any:
    from b12x.integration.vllm import indexer_backend, indexer_hooks

    # a staticmethod in the class dict: unwrap vLLM's, wrap b12x's
    vllm_cls = getattr(vllm_value, "__func__", vllm_value)
    return staticmethod(indexer_backend.make_v32_indexer_cls(vllm_cls, indexer_hooks.accept))


def _v32_op(_: Any) -> Any:
    from b12x.integration.vllm import indexer_backend

    return indexer_backend.B12xSparseAttnIndexer


def _v32_dispatcher(vllm_fn: Any) -> Any:
    from b12x.integration.vllm import indexer_backend

    return indexer_backend.make_v32_dispatcher(vllm_fn)


PATCHES: tuple[Patch, ...] = (
    Patch(
        "plugin",
        "vllm.utils.b12x",
        "_HAS_B12X",
        lambda _: False,
        "vLLM detects the public b12x package (vllm[b12x]) with find_spec('b12x'), which finds "
        "this one; its getters already return None here, this makes has_b12x() agree",
    ),
    Patch(
        "allreduce",
        _SLOT,
        "CustomAllreduce",
        _slot,
        "vLLM's CudaCommunicator builds its custom all-reduce slot from this name; b12x's slot "
        "is built from the same call and keeps vLLM's own behind it",
    ),
    Patch(
        "indexer",
        f"{_V4}:DeepseekV4Attention",
        "_get_indexer_cls",
        _v4_indexer_cls,
        "DeepSeek V4 asks it for each layer's indexer class; b12x's where the layer's config "
        "allows, vLLM's otherwise",
    ),
    Patch(
        "indexer",
        f"{_V32}:DeepseekV32Attention",
        "indexer_cls",
        _v32_indexer_cls,
        "DeepSeek V3.2 / GLM build their indexer from it; b12x's (with b12x's index cache) "
        "where the layer's config allows, vLLM's otherwise",
    ),
    Patch(
        "indexer",
        "vllm.model_executor.custom_op",
        "SparseAttnIndexer",
        _v32_op,
        "vLLM's extension point for its SparseAttnIndexer CustomOp: b12x's op for a b12x index "
        "cache (no DeepGEMM needed), vLLM's own for every other cache",
        kind="oot",
    ),
    Patch(
        "indexer",
        _V32,
        "sparse_attn_indexer",
        _v32_dispatcher,
        "V3.2's attention calls this function directly (no extension point): layers b12x owns "
        "go to b12x's op, every other call to vLLM's function",
    ),
)

# (owner, attribute) -> (vLLM's value, b12x's value), for the patches that are in
_applied: dict[tuple[str, str], tuple[Any, Any]] = {}


def _target(owner: str) -> Any:
    module, _, cls = owner.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, cls) if cls else obj


def _current(patch: Patch) -> Any:
    if patch.kind == "oot":
        from vllm.model_executor.custom_op import op_registry_oot

        return op_registry_oot.get(patch.attribute, _NOTHING)
    return vars(_target(patch.owner)).get(patch.attribute, _NOTHING)


def _apply(patch: Patch) -> None:
    key = (patch.owner, patch.attribute)
    if key in _applied:
        if _current(patch) is _applied[key][1]:
            return  # in already
        _applied.pop(key)  # something put another value there since: b12x's goes back in
    vllm_value = _current(patch)
    ours = patch.make(None if vllm_value is _NOTHING else vllm_value)
    if patch.kind == "oot":
        from vllm.model_executor.custom_op import CustomOp, op_registry_oot

        op_registry_oot.pop(patch.attribute, None)  # register_oot refuses a taken name
        CustomOp.register_oot(name=patch.attribute)(ours)
    else:
        setattr(_target(patch.owner), patch.attribute, ours)
    _applied[key] = (vllm_value, ours)


def _undo(patch: Patch) -> None:
    vllm_value, _ = _applied.pop((patch.owner, patch.attribute), (_NOTHING, None))
    if patch.kind == "oot":
        from vllm.model_executor.custom_op import op_registry_oot

        op_registry_oot.pop(patch.attribute, None)
        if vllm_value is not _NOTHING:
            op_registry_oot[patch.attribute] = vllm_value
        return
    target = _target(patch.owner)
    if vllm_value is _NOTHING:
        if patch.attribute in vars(target):
            delattr(target, patch.attribute)
    else:
        setattr(target, patch.attribute, vllm_value)


def install(component: str) -> None:
    """Applies ``component``'s patches (idempotent); on a failure undoes them
    all and raises (ImportError / AttributeError: vLLM moved a seam)."""
    patches = [p for p in PATCHES if p.component == component]
    try:
        for patch in patches:
            _apply(patch)
    except Exception:
        uninstall(component)
        raise


def uninstall(component: str) -> None:
    """Puts vLLM's own values back for ``component`` (objects already built keep theirs)."""
    for patch in reversed([p for p in PATCHES if p.component == component]):
        if (patch.owner, patch.attribute) in _applied:
            _undo(patch)


def installed(component: str) -> bool:
    """Whether ``component``'s patches are in."""
    return any((p.owner, p.attribute) in _applied for p in PATCHES if p.component == component)


def original(owner: str, attribute: str) -> Any:
    """vLLM's own value of a patched attribute (KeyError while it is not patched)."""
    value = _applied[(owner, attribute)][0]
    if value is _NOTHING:
        raise KeyError((owner, attribute))
    return value
