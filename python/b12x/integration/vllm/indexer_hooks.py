"""Makes stock vLLM run DeepSeek V3.2 / V4 sparse indexing through b12x.

``install(vllm_config)`` applies the patch table's indexer entries
(:mod:`~b12x.integration.vllm.patches`): vLLM's ``DeepseekV4Attention``
indexer class, ``DeepseekV32Attention.indexer_cls``, V3.2's
``SparseAttnIndexer`` registered out of tree and its ``sparse_attn_indexer``
function now point at :mod:`~b12x.integration.vllm.indexer_backend`, so every
DSA layer built afterwards plans, binds and runs b12x's indexer, with
metadata from b12x's builder. vLLM is imported only when ``install`` runs.

Every layer decides again when it is built, from the config it is built
with: an unsupported one (no GPU the kernels run on, an MXFP4 index cache,
decode or prefill context parallelism, adaptive verification) gets vLLM's
own classes, and the reason is logged once. So does a GPU where b12x's
indexer is not shown at least as fast as stock vLLM's
(:mod:`~b12x.integration.vllm.speed_rule`: on Hopper today). ``install``
says False, with the reason logged once, when what it can see already rules
b12x out.
"""

from __future__ import annotations

import logging
from typing import Any

from b12x.integration.vllm import patches
from b12x.integration.vllm._once import log_once

__all__ = [
    "accept",
    "install",
    "install_reason",
    "installed",
    "uninstall",
    "unsupported_reason",
]

log = logging.getLogger("b12x.integration.vllm")


def _log_once(reason: str) -> None:
    log_once(log, logging.INFO, "b12x indexer not used: %s; vLLM's own indexer runs", reason)


def _device_reason() -> str | None:
    """Why this process's GPU cannot run the kernels, or None.

    Before CUDA is initialised (a plugin loads before vLLM forks its
    workers) only NVML is asked, through vLLM's platform, so no CUDA
    context is created; once it is, b12x's own check runs on the current
    device.
    """
    import torch

    from b12x.attention import dsa_indexer

    if torch.cuda.is_initialized():
        device = torch.cuda.current_device()
        if not dsa_indexer.is_supported(device):
            return f"cuda:{device} does not run the indexer kernels (FP8 MMA needs sm_89+)"
        return _speed_reason(tuple(torch.cuda.get_device_capability(device)))
    try:
        from vllm.platforms import current_platform
    except ImportError as e:
        return f"vLLM is not importable ({e})"
    if not current_platform.is_cuda():
        return f"vLLM's platform is {current_platform.device_name!r}, not CUDA"
    from b12x import _core

    capability = current_platform.get_device_capability()
    least = _core.MIN_COMPUTE_CAPABILITY
    if capability is None or tuple(capability) < least:
        return f"GPU compute capability {capability} is below {least} (FP8 MMA)"
    return _speed_reason(tuple(capability))


def _speed_reason(capability: tuple[int, ...]) -> str | None:
    """Why b12x would make this GPU's indexer slower than stock vLLM's, or None
    (:mod:`~b12x.integration.vllm.speed_rule`)."""
    from b12x.integration.vllm import speed_rule

    major, minor = capability[0], capability[1]
    decision = speed_rule.decide(
        (major, minor), speed_rule.PLAN_PRECISION, speed_rule.stock_fast_path(inside_vllm=True)
    )
    return None if decision.use_b12x else decision.reason


def _config_reason(vllm_config: Any) -> str | None:
    """Why ``vllm_config`` asks for something the b12x indexer does not do, or None."""
    parallel = vllm_config.parallel_config
    if parallel.decode_context_parallel_size > 1:
        return f"decode context parallelism (size {parallel.decode_context_parallel_size})"
    if parallel.prefill_context_parallel_size > 1:
        return f"prefill context parallelism (size {parallel.prefill_context_parallel_size})"
    kv_dtype = vllm_config.attention_config.resolve_indexer_kv_dtype("fp8")
    if kv_dtype != "fp8":
        return f"indexer_kv_dtype={kv_dtype!r} (b12x reads the FP8 index cache)"
    if getattr(vllm_config.speculative_config, "enable_adaptive_verification", False):
        return "adaptive verification (device query lengths that differ from the host's)"
    return None


def unsupported_reason(vllm_config: Any = None) -> str | None:
    """Why b12x's indexer cannot serve here (with ``vllm_config``, if given), or None."""
    reason = _device_reason()
    if reason is None and vllm_config is not None:
        reason = _config_reason(vllm_config)
    return reason


def accept(vllm_config: Any) -> bool:
    """A layer's decision at construction time (logs why not, once)."""
    reason = unsupported_reason(vllm_config)
    if reason is not None:
        _log_once(reason)
    return reason is None


def install(vllm_config: Any = None) -> bool:
    """Routes vLLM's DeepSeek V3.2 / V4 sparse indexer through b12x.

    Idempotent: the hooks go in once; later calls only check. Layers built
    before the first successful call keep vLLM's indexer.

    Parameters
    ----------
    vllm_config
        vLLM's ``VllmConfig``, when known: checked for what the b12x indexer
        does not do. Without it only the GPU is checked here; every layer
        still checks the config it is built with.

    Returns
    -------
    bool
        True when the hooks are in and nothing seen rules b12x out; False
        (the reason logged once) otherwise, with vLLM left as it was.
    """
    return install_reason(vllm_config) is None


def install_reason(vllm_config: Any = None) -> str | None:
    """:func:`install`, answering why not: None when the hooks are in and
    nothing seen rules b12x out, else the reason (logged once)."""
    reason = unsupported_reason(vllm_config)
    if reason is None and not patches.installed("indexer"):
        try:
            patches.install("indexer")
        except (ImportError, AttributeError, KeyError) as e:
            reason = f"vLLM's DeepSeek indexer seams are not where b12x expects them ({e!r})"
        else:
            log.info("b12x indexer installed for DeepSeek V3.2 / V4 sparse attention")
    if reason is not None:
        _log_once(reason)
    return reason


def installed() -> bool:
    """True while the hooks are in."""
    return patches.installed("indexer")


def uninstall() -> None:
    """Puts vLLM's own classes and functions back (layers already built keep theirs)."""
    patches.uninstall("indexer")
