"""Single-node all-reduce over CUDA IPC: one-shot, fused add + RMSNorm, two-shot.

:class:`AllReduce` is built collectively from a torch.distributed process group
(one process per GPU, one node; :mod:`~b12x.comm.pcie.handshake`). Every rank
allocates an IPC slab, the 64-byte handles travel over the group as a uint8
tensor, and each rank maps its peers' slabs. Every setup step ends with an
exchange of failure flags, so either every rank enables the runtime or every
rank disables it and logs why.

Collectives are declared before use (:meth:`AllReduce.declare`): each declared
invocation is routed (spec §5.2) to the one-shot, fused or two-shot kernel, or
declined; equal declarations share one prepared plan. Live calls find their
plan by an exact key (:meth:`AllReduce.admit`, :meth:`AllReduce.has_plan_for`,
:meth:`AllReduce.plan_for`); anything undeclared declines to the next backend
(NCCL). Kernels launch on torch's current stream and choose their staging
slot on the device, so a captured CUDA graph replays correctly after its inputs
are rewritten.

Limits and the environment knobs are in :mod:`~b12x.comm.pcie.knobs`. The
defaults come from ``b12x bench allreduce --gpus 2`` on NVLink H200s (graph
replay, bf16): the one-shot takes 5.0-6.6 us for 8-256 KiB against NCCL's
12.2-14.0, 8.0 us at 512 KiB and 10.1 us at 1 MiB (still ahead of the push
two-shot's 11.4), so its ceiling sits far above the reference's PCIe default of
84 KB; the fused kernel is 6.3-7.0 us for 1-16 rows x 7168. The slab of each
rank holds two staging slots of the largest ceiling (the push two-shot stages
twice its bytes: 128 MiB + 8.5 KiB per rank with the defaults).

Graph and stream contract: one AllReduce is used by one stream at a time, in
the same order on every rank (the epoch that selects slots advances per
launch); captured graphs hold only kernel nodes, so replays need no host work.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple, Protocol

import torch
import torch.distributed as dist

from b12x import _core
from b12x._core import AllReducePlan, DeclaredPlanIndex
from b12x.comm.pcie import handshake, knobs
from b12x.comm.pcie.declared import declare_plans
from b12x.comm.pcie.invocation import FUSED, PLAIN
from b12x.comm.pcie.knobs import (
    ENV_FUSED_MAX,
    ENV_ONESHOT_MAX,
    ENV_TIMEOUT,
    ENV_TWOSHOT_MAX,
    ENV_TWOSHOT_PUSH,
    ENV_TWOSHOT_ROW_ELEMS,
    Limits,
    parse_byte_size,
)
from b12x.cuda import device_index
from b12x.errors import B12xError, ConfigError, DeviceError, UndeclaredPlanError

__all__ = [
    "ENV_FUSED_MAX",
    "ENV_ONESHOT_MAX",
    "ENV_TIMEOUT",
    "ENV_TWOSHOT_MAX",
    "ENV_TWOSHOT_PUSH",
    "ENV_TWOSHOT_ROW_ELEMS",
    "FUSED",
    "PLAIN",
    "AllReduce",
    "AllReducePlan",
    "Declaration",
    "Limits",
    "parse_byte_size",
    "prepare_declarations",
    "route",
    "route_with_reason",
]

log = logging.getLogger("b12x.comm.pcie")

DeviceLike = torch.device | str | int


class Declaration(Protocol):
    """What :meth:`AllReduce.declare` reads of a declared invocation
    (:class:`b12x.comm.pcie.Invocation` has it all): routing reads the
    operation, shape, dtype and strides; the index the rest of its key."""

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


def route_with_reason(
    operation: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    strides: Sequence[int] | None,
    world: int,
    limits: Limits,
) -> tuple[str | None, str]:
    """(route, "") or (None, why): "oneshot", "oneshot_fused" or "twoshot"."""
    return _core.allreduce_route(operation, shape, dtype, strides, world, limits)


def route(
    operation: str,
    shape: Sequence[int],
    dtype: torch.dtype,
    strides: Sequence[int] | None,
    world: int,
    limits: Limits,
) -> str | None:
    """The route of a declaration (spec §5.2), or None when it declines to NCCL."""
    return route_with_reason(operation, shape, dtype, strides, world, limits)[0]


def prepare_declarations(
    invocations: Iterable[Declaration],
    world: int,
    limits: Limits,
    multiprocessors: int,
    twoshot_push: bool = False,
) -> tuple[list[tuple[Declaration, AllReducePlan]], list[tuple[Declaration, str]]]:
    """Route every invocation and prepare one plan per distinct declaration.

    ``invocations`` carry ``operation``, ``shape``, ``dtype``, ``strides``
    (None = contiguous). Returns ``(routed, declined)``: routed is
    ``[(invocation, plan)]`` in declaration order, where equal declarations
    (route, shape, dtype, address strides) share one ``AllReducePlan``;
    declined is ``[(invocation, why)]``. ``twoshot_push`` picks the two-shot
    transport. Pure host logic: no GPU needed.
    """
    return _core.allreduce_prepare(invocations, world, limits, multiprocessors, twoshot_push)


def cuda_device(device: DeviceLike | None) -> torch.device:
    """The CUDA device of ``device`` (:func:`b12x.cuda.device_index`'s grammar;
    None or a bare ``"cuda"``: torch's current device, cuda:0 without CUDA so
    the set-up can decline); a malformed one is a DeviceError naming AllReduce."""
    return torch.device("cuda", device_index(device, op="AllReduce"))


class _Settings(NamedTuple):
    device: torch.device
    limits: Limits
    timeout_ns: int
    twoshot_push: bool | None  # None: auto, decided collectively
    fail_rank: int | None


def _read_settings(
    device: DeviceLike | None,
    limits: Limits | None,
    timeout_s: float | None,
    twoshot_push: bool | None,
) -> _Settings:
    """Every argument and knob of the constructor, checked (B12xError on a bad one)."""
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(
            f"AllReduce: limits expected a b12x.comm.pcie.Limits, got {type(limits).__name__}"
        )
    return _Settings(
        device=cuda_device(device),
        limits=Limits.from_env() if limits is None else limits,
        timeout_ns=knobs.timeout_ns(timeout_s),
        twoshot_push=knobs.twoshot_push(twoshot_push),
        fail_rank=knobs.fail_setup_rank(),
    )


def _environment_error(world: int, ordinal: int) -> Exception | None:
    """Why this rank cannot run the all-reduce here, if it cannot."""
    try:
        if not 2 <= world <= 8:
            raise ValueError(f"world size expected 2..8, got {world}")
        if not _core.driver_present():
            raise RuntimeError("no CUDA driver")
        count = _core.device_count()
        if ordinal >= count:
            raise DeviceError(
                f"AllReduce: device expected one of the {count} visible, got cuda:{ordinal}"
            )
    except Exception as e:
        return e
    return None


def _capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph (False without CUDA)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


class AllReduce:
    """One rank's CUDA-IPC all-reduce over a torch.distributed group.

    Construction is collective (every rank of ``group`` must call it, in the
    same order as their other collectives). If any setup step fails on any
    rank, ``enabled`` is False on every rank, ``disabled_reason`` says why, and
    every lookup declines. Bad arguments and knobs are read first and agreed
    like a failed step: every rank disables and the rank that was given them
    raises :class:`b12x.errors.ConfigError` / :class:`b12x.errors.DeviceError`,
    so no peer is left waiting.

    Parameters
    ----------
    group
        The process group (default: the world group); one process per GPU of
        one node, 2 to 8 ranks.
    device
        This rank's CUDA device (default: torch's current device).
    limits
        Route ceilings (default: :meth:`Limits.from_env`). Must agree on all ranks.
    timeout_s
        Bound of every cross-GPU wait, seconds in (0, 3600] (default
        ``B12X_ALLREDUCE_TIMEOUT_S`` or 60 s). A wait that exceeds it records
        an error that surfaces as :class:`b12x.errors.CollectiveTimeoutError`
        instead of a hang.
    twoshot_push
        Two-shot transport: True, peers store their shards into the owner's
        slot (fast over NVLink, slow SM peer writes over PCIe); False, the owner
        pulls them from the peers' staged copies (the reference protocol).
        None: ``B12X_ALLREDUCE_TWOSHOT_PUSH`` (0, 1 or auto, the default:
        push iff every pair of GPUs has native P2P atomics, i.e. NVLink).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        *,
        device: DeviceLike | None = None,
        limits: Limits | None = None,
        timeout_s: float | None = None,
        twoshot_push: bool | None = None,
    ) -> None:
        self.rank: int = dist.get_rank(group)  # raises without a default group
        self.world_size: int = dist.get_world_size(group)
        resolved = dist.group.WORLD if group is None else group
        assert resolved is not None  # get_rank found the default group
        self.group: dist.ProcessGroup = resolved
        self.enabled = False
        self.disabled_reason: str | None = None
        self._rt: _core.IpcAllReduce | None = None
        self._index = DeclaredPlanIndex()
        self._closed = False

        # 1. arguments and knobs, read before any collective; a bad one fails
        #    'validate' for every rank and is raised here after the agreement
        settings: _Settings | None = None
        error: B12xError | None = None
        try:
            settings = _read_settings(device, limits, timeout_s, twoshot_push)
        except B12xError as e:
            error = e
        here = cuda_device(None) if settings is None else settings.device
        self._hs: handshake.Handshake | None = handshake.Handshake(
            self.group, self.rank, self.world_size, handshake.comm_device(self.group, here)
        )
        why = self._hs.agree("validate", error or _environment_error(self.world_size, here.index))
        if settings is None:
            assert error is not None
            raise error
        self.device = settings.device
        self.limits = settings.limits
        self.timeout_s = settings.timeout_ns * 1e-9
        self.twoshot_push: bool | None = settings.twoshot_push  # None until set-up decides
        self._ordinal: int = self.device.index
        if why is not None:
            self._disable(why)
            return

        # 2. the two-shot transport (collective when auto), then the runtime
        if self.twoshot_push is None:
            self.twoshot_push = self._hs.all_pairs_nvlink(self._ordinal)
        rt, why = handshake.open_runtime(
            self._hs,
            self._ordinal,
            self.limits,
            self.twoshot_push,
            settings.timeout_ns,
            settings.fail_rank,
        )
        if rt is None:
            self._disable(why or "set-up failed")
            return
        self._rt = rt
        self.enabled = True
        log.info(
            "b12x IPC all-reduce enabled on rank %d/%d (cuda:%d, slab %d bytes, %s, two-shot %s)",
            self.rank,
            self.world_size,
            self._ordinal,
            rt.slab_bytes,
            self.limits,
            "push" if self.twoshot_push else "pull",
        )

    @classmethod
    def host_stand_in(
        cls, world: int = 2, *, rank: int = 0, limits: Limits | None = None, device: str = "cpu"
    ) -> AllReduce:
        """An enabled AllReduce without a process group whose device side is
        host memory (:meth:`b12x._core.IpcAllReduce.host_stand_in`): declaring,
        admission, bind and the health read are the real ones, a launch is
        counted instead of enqueued (``runtime.stand_in_launches``). For
        ``b12x bench host`` and tests on machines without GPUs."""
        self = cls.__new__(cls)
        self.rank, self.world_size = rank, world
        self.limits = Limits() if limits is None else limits
        self.device = torch.device(device)
        self.timeout_s = knobs.timeout_ns(None) * 1e-9
        self.twoshot_push = False
        self._rt = _core.IpcAllReduce.host_stand_in(device, rank, world, self.limits)
        self._index = DeclaredPlanIndex()
        self._closed = False
        self.enabled, self.disabled_reason = True, None
        self._hs = None  # no group: close() frees locally
        return self

    def runtime_launches(self) -> int | None:
        """Launches the host stand-in took (None for a real runtime or once closed)."""
        return None if self._rt is None else self._rt.stand_in_launches

    def _disable(self, why: str) -> None:
        self.enabled = False
        self.disabled_reason = why
        log.warning("b12x IPC all-reduce disabled on rank %d: %s", self.rank, why)

    def _live(self, operation: str) -> _core.IpcAllReduce:
        """The open runtime, or UndeclaredPlanError saying why there is none."""
        rt = self._rt
        if not self.enabled or rt is None:
            raise UndeclaredPlanError(
                f"PCIe collective has no declared plan for {operation}: the runtime is "
                f"disabled ({self.disabled_reason or 'closed'})"
            )
        return rt

    # ------------------------------------------------------------- declarations
    def declare(self, invocations: Iterable[Declaration]) -> None:
        """Route and prepare declared invocations; replaces earlier declarations.

        Each invocation carries ``name``, ``operation`` (:data:`PLAIN` or
        :data:`FUSED`), ``shape``, ``dtype``, ``strides`` (None = contiguous),
        ``norm_weight`` and ``epsilon`` (fused). Declined invocations are
        logged at debug level and their live calls decline. Every rank must
        declare the same invocations. The index is swapped in one step, so a
        concurrent lookup sees the old declarations or the new ones.
        """
        invocations = list(invocations)
        if not self.enabled or self._rt is None:
            self._index.clear()
            return
        _, declined = declare_plans(
            self._index,
            invocations,
            self.world_size,
            self.limits,
            self._rt.multiprocessors,
            bool(self.twoshot_push),
        )
        for inv, why in declined:
            log.debug("b12x IPC all-reduce declines %s: %s", getattr(inv, "name", inv), why)

    @property
    def declared_plans(self) -> list[tuple[Declaration, AllReducePlan]]:
        """(invocation, plan) of every routed declaration, in declaration order."""
        pairs: list[tuple[Declaration, AllReducePlan]] = self._index.declared()
        return pairs

    @property
    def index(self) -> DeclaredPlanIndex:
        """The index of the declared plans (what :meth:`admit` looks calls up in)."""
        return self._index

    def admit(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
        residual: torch.Tensor | None = None,
        out: torch.Tensor | None = None,
    ) -> AllReducePlan | None:
        """The declared plan if this call runs here, else None; never raises.

        One Rust call: the exact-key lookup (operation, shape, dtype, address
        strides; for :data:`FUSED` the weight's identity and epsilon), then
        what the key cannot fix and the launch would refuse: device, 16-byte
        alignment, and for :data:`FUSED` the ``residual``, ``weight`` and
        ``out`` of the call (``residual_out=residual``; ``out`` None: in
        place, ``out=inp``). Pass the plan on as ``plan=`` so the call does
        not look it up again.
        """
        rt = self._rt
        if not self.enabled or rt is None:
            return None
        return rt.admit(self._index, inp, operation, weight, epsilon, residual, out)

    def has_plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> bool:
        """True when a declared plan serves this call; never raises."""
        if not self.enabled:
            return False
        if self._index.has_plan_for(inp, operation, weight, epsilon):
            return True
        log.debug(
            "b12x PCIe all-reduce declines undeclared shape %s %s",
            tuple(getattr(inp, "shape", ())),
            getattr(inp, "dtype", None),
        )
        return False

    def plan_for(
        self,
        inp: torch.Tensor,
        operation: str = PLAIN,
        weight: torch.Tensor | None = None,
        epsilon: float | None = None,
    ) -> AllReducePlan:
        """The declared plan of this call; raises UndeclaredPlanError if none."""
        self._live(operation)
        try:
            plan: AllReducePlan = self._index.plan_for(inp, operation, weight, epsilon)
            return plan
        except UndeclaredPlanError as e:
            if _capturing():
                raise UndeclaredPlanError(
                    f"cold (undeclared) plan cannot be captured in a CUDA graph: {e}"
                ) from None
            raise

    # ------------------------------------------------------------- live calls
    def all_reduce(
        self,
        inp: torch.Tensor,
        out: torch.Tensor | None = None,
        *,
        plan: AllReducePlan | None = None,
    ) -> torch.Tensor:
        """Sum ``inp`` over the group into ``out`` (default: a new tensor) on
        torch's current stream; every rank gets identical bits.

        ``plan``: the declared plan of this call when the caller already looked
        it up (:meth:`admit`); None looks it up. The launch checks ``inp`` and
        ``out`` against the plan either way. A disabled or closed runtime
        raises :class:`b12x.errors.UndeclaredPlanError`, with or without a plan.
        """
        rt = self._live(PLAIN)
        if plan is None:
            plan = self.plan_for(inp)
        if out is None:
            out = torch.empty_like(inp)
        rt.run(plan, inp, out)
        return out

    def fused_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
        *,
        plan: AllReducePlan | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``r = allreduce(inp) + residual``; ``residual_out = r``;
        ``out = r * rsqrt(mean(r^2) + eps) * weight`` (fp32 math, one rounding
        each). Defaults are in place: ``out=inp``, ``residual_out=residual``.
        ``plan`` as for :meth:`all_reduce`."""
        rt = self._live(FUSED)
        if plan is None:
            plan = self.plan_for(inp, FUSED, weight, eps)
        out = inp if out is None else out
        residual_out = residual if residual_out is None else residual_out
        rt.run_fused(plan, inp, residual, weight, eps, out, residual_out)
        return out, residual_out

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Scope of a CUDA graph capture on the caller's stream. Refuses to
        start without declared plans; a no-op when the runtime is disabled."""
        if self.enabled and len(self._index) == 0:
            raise UndeclaredPlanError(
                "PCIe capture requires a declared native preparation plan: call declare() first"
            )
        yield

    def check(self) -> None:
        """Raise CollectiveTimeoutError if a kernel of this rank recorded a
        timeout (reads host-mapped memory; does not synchronize)."""
        if self._rt is not None:
            self._rt.check()

    def synchronize(self) -> None:
        """Wait for this rank's device work, then :meth:`check`."""
        torch.cuda.synchronize(self.device)
        self.check()

    # ------------------------------------------------------------- close
    def close(self) -> None:
        """Release every mapping and allocation, coordinated over the group.

        Idempotent. Collective while the runtime is healthy (every rank must
        call it). After a timeout the peers cannot be trusted to take part:
        this rank closes its mappings and keeps its own slab allocated
        (a peer kernel may still read it) until the process exits.
        """
        if self._closed:
            return
        self._closed = True
        was_enabled = self.enabled
        self.enabled = False
        self.disabled_reason = self.disabled_reason or "closed"
        self._index.clear()
        rt, self._rt = self._rt, None
        if rt is None:
            return
        if self._hs is None:  # the host stand-in: nothing shared
            rt.free()
        else:
            handshake.close_runtime(self._hs, rt, self.device, healthy=was_enabled)

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else f"disabled ({self.disabled_reason})"
        return (
            f"AllReduce(rank={self.rank}, world={self.world_size}, device={self.device}, "
            f"{state}, plans={len(self._index)})"
        )
