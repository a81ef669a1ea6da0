"""The declared invocation record of a PCIe collective, what declaring reads
of one (:class:`Declaration`), and the names of its two operations (their one
home: every other module imports them)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal, Protocol

from b12x import _core

if TYPE_CHECKING:
    import torch

#: The plain sum all-reduce.
PLAIN: Final = "all_reduce"
#: All-reduce, then residual add and RMSNorm with a declared weight.
FUSED: Final = "all_reduce_fused_add_rms_norm"
ALL_REDUCE: Final = PLAIN
ALL_REDUCE_FUSED_ADD_RMS_NORM: Final = FUSED
Operation = Literal["all_reduce", "all_reduce_fused_add_rms_norm"]


class Declaration(Protocol):
    """What declaring reads of a declared invocation (:class:`Invocation`
    has it all): routing reads the operation, shape, dtype and strides; the
    index the rest of its key."""

    @property
    def name(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def shape(self) -> Sequence[int]: ...
    @property
    def dtype(self) -> torch.dtype: ...
    @property
    def strides(self) -> Sequence[int] | None: ...
    @property
    def input_alignment(self) -> int: ...
    @property
    def norm_weight(self) -> torch.Tensor | None: ...
    @property
    def epsilon(self) -> float | None: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Invocation:
    """One collective call a model declares before serving.

    Parameters
    ----------
    name
        Unique, nonempty name of the declaration (e.g. ``"layers.3.moe.m16"``).
    operation
        ``"all_reduce"`` or ``"all_reduce_fused_add_rms_norm"`` (all-reduce,
        residual add and RMSNorm).
    shape
        Extents, each an ``int`` > 0 (a list is stored as a tuple).
    dtype
        ``torch.float16``, ``torch.bfloat16`` or ``torch.float32``.
    strides
        Element strides, one ``int`` > 0 per dimension; ``None`` means row-major
        contiguous.
    input_alignment
        Byte alignment the input is promised to have: a power of two >= 16.
    norm_weight
        The RMSNorm weight tensor: required for the fused operation, forbidden
        for the plain one. Declarations match by the weight's identity, never
        its values.
    epsilon
        RMSNorm epsilon, >= 0: required for the fused operation, forbidden for
        the plain one.
    channel_id
        The one-shot channel (``None``: the single channel).
    persistent_input
        A producer-owned input buffer (registered one-shot routes only).

    Raises
    ------
    b12x.ConfigError
        (a ValueError) when a field breaks a rule; the message names the field,
        what it must be and what it is. The rules live in b12x-core
        (``collective::Declaration``) and are checked in the reference's order.
    b12x.NotATensorError
        (a TypeError) when the fused operation's ``norm_weight`` is not a tensor.

    Notes
    -----
    Compared by identity (``eq=False``): a record carries tensors, whose
    ``==`` is elementwise. :func:`b12x.comm.pcie.plan_key` gives the value
    the index compares.
    """

    name: str
    operation: Operation
    shape: tuple[int, ...]
    dtype: torch.dtype
    strides: tuple[int, ...] | None = None
    input_alignment: int = 16
    norm_weight: torch.Tensor | None = None
    epsilon: float | None = None
    channel_id: str | None = None
    persistent_input: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for field in ("shape", "strides"):
            value: object = getattr(self, field)
            if isinstance(value, list):
                object.__setattr__(self, field, tuple(value))
        _core.invocation_key(self)
