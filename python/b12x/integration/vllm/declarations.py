"""All-reduce declarations derived from a vLLM config, so no model code declares anything.

A tensor-parallel all-reduce in vLLM reduces ``(num_tokens, hidden_size)`` in
the model dtype. ``num_tokens`` is any count up to
``scheduler_config.max_num_batched_tokens`` in eager prefill and one of
``compilation_config.cudagraph_capture_sizes`` in a captured graph, so
:class:`AutoDeclarations` declares every such count (and the capture sizes
beyond it) whose bytes fit under a route ceiling; the runtime's routing takes
what it can and the rest declines to vLLM's own backends.

The fused all-reduce + add + RMSNorm is keyed by the norm's weight, which no
config names: each weight is recorded the first time the fused op sees it
(:meth:`AutoDeclarations.norm`) and declared for the same token counts at the
first call that could run fused. vLLM's profile run (``max_num_batched_tokens``
rows, above the fused ceiling) so records every norm of the model before
anything is declared, and one declaration covers them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from b12x.comm.pcie import FUSED, PLAIN, Invocation

__all__ = ["MAX_NORMS", "AutoDeclarations", "ServingShapes"]

# A model has about two RMSNorms per layer; past this many weights the fused
# op declines instead of growing the declarations without bound.
MAX_NORMS = 1024


@dataclass(frozen=True)
class ServingShapes:
    """What a vLLM config says about the TP all-reduces it will issue."""

    hidden_size: int
    dtype: torch.dtype
    max_num_batched_tokens: int
    cudagraph_capture_sizes: tuple[int, ...] = ()

    @classmethod
    def from_vllm_config(cls, config: Any) -> ServingShapes | None:
        """The shapes of ``config`` (a ``vllm.config.VllmConfig``); None without a model."""
        model = getattr(config, "model_config", None)
        if model is None:
            return None
        sizes = getattr(config.compilation_config, "cudagraph_capture_sizes", None) or ()
        return cls(
            hidden_size=int(model.get_hidden_size()),
            dtype=model.dtype,
            max_num_batched_tokens=int(config.scheduler_config.max_num_batched_tokens),
            cudagraph_capture_sizes=tuple(sorted({int(s) for s in sizes if int(s) > 0})),
        )

    def token_counts(self, row_bytes: int, max_bytes: int) -> list[int]:
        """Every token count vLLM can issue whose ``count * row_bytes <= max_bytes``."""
        if row_bytes <= 0 or max_bytes < row_bytes:
            return []
        top = max_bytes // row_bytes
        eager = range(1, min(self.max_num_batched_tokens, top) + 1)
        return sorted({*eager, *(n for n in self.cudagraph_capture_sizes if n <= top)})


class AutoDeclarations:
    """A describer (``describe(workload)``) for :class:`~b12x.integration.vllm.PcieAllReduce`.

    Parameters
    ----------
    shapes
        From the vLLM config.
    limits
        The runtime's route ceilings (:class:`b12x.comm.pcie.allreduce.Limits`);
        they bound the token counts declared, routing decides the rest.
    """

    def __init__(self, shapes: ServingShapes, limits: Any) -> None:
        self.shapes = shapes
        self.limits = limits
        itemsize = torch.empty((), dtype=shapes.dtype).element_size()
        row = shapes.hidden_size * itemsize
        plain_max = max(limits.oneshot_max, limits.twoshot_max)
        self._plain = [
            Invocation(
                name=f"vllm.all_reduce.m{n}",
                operation=PLAIN,
                shape=(n, shapes.hidden_size),
                dtype=shapes.dtype,
            )
            for n in shapes.token_counts(row, plain_max)
        ]
        # (data_ptr, device, dtype, shape, strides, epsilon)
        #   -> (declared weight, its invocations, most rows declared)
        self._norms: dict[tuple[Any, ...], tuple[torch.Tensor, list[Any], int]] = {}
        self.pending = False  # norms added since the owner last declared

    def describe(self, workload: Any = None) -> list[Any]:
        """Every declaration: the plain all-reduces, then each norm's fused ones."""
        return self._plain + [inv for _, invs, _ in self._norms.values() for inv in invs]

    @property
    def norm_count(self) -> int:
        return len(self._norms)

    def norm(self, weight: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, int] | None:
        """``(declared weight, most rows declared)`` for ``(weight, epsilon)``
        (a call with more rows, e.g. vLLM's profile run, cannot run fused); a
        new weight is recorded and sets :attr:`pending` until the owner
        declares again.

        Declarations match a weight by object identity, but vLLM hands the
        norm's ``weight.data`` (a new alias each time), so a weight is found
        by its storage and the first object seen stands for it from then on.
        None when the weight cannot be declared (not a 1-D row of the model
        dtype, or :data:`MAX_NORMS` reached).
        """
        key = (
            weight.data_ptr(),
            weight.device,
            weight.dtype,
            tuple(weight.shape),
            tuple(weight.stride()),
            float(epsilon),
        )
        found = self._norms.get(key)
        if found is not None:
            return found[0], found[2]
        if (
            weight.ndim != 1
            or weight.dtype != self.shapes.dtype
            or not weight.is_contiguous()
            or epsilon < 0
            or len(self._norms) >= MAX_NORMS
        ):
            return None
        hidden = weight.shape[0]
        index = len(self._norms)
        counts = self.shapes.token_counts(hidden * weight.element_size(), self.limits.fused_max)
        invocations = [
            Invocation(
                name=f"vllm.fused_add_rms_norm.{index}.m{n}",
                operation=FUSED,
                shape=(n, hidden),
                dtype=weight.dtype,
                norm_weight=weight,
                epsilon=float(epsilon),
            )
            for n in counts
        ]
        self._norms[key] = (weight, invocations, counts[-1] if counts else 0)
        self.pending = True
        return weight, self._norms[key][2]
