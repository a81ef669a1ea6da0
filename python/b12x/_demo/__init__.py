"""The pieces of ``b12x demo``: a miniature DeepSeek V4 tensor-parallel decode step.

* :mod:`.model`: the index projections of a C4 layer, a paged FP8 index cache
  and a vLLM-shaped batch (decode rows, one-request prefill chunks).
* :mod:`.indexer_steps`: the indexer through the vLLM adapter (CPU reference;
  GPU kernels under a CUDA graph).
* :mod:`.lookup_step`: declared all-reduce plans and live lookups.
* :mod:`.tp_step`: the layer's fused all-reduce + RMSNorm on 2+ GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class StepResult:
    """One line of the demo's table; ``status`` is ``ok``, ``FAIL`` or ``skip``."""

    step: str
    where: str
    result: str
    time: str = "-"
    status: str = "ok"
