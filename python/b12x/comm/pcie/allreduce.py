"""Single-node all-reduce over CUDA IPC: one-shot, fused add + RMSNorm, two-shot.

:class:`AllReduce` is built collectively from a torch.distributed process group
(one process per GPU, one node; :mod:`~b12x.comm.pcie.handshake`). Every rank
allocates an IPC slab, the 64-byte handles travel over the group as a uint8
tensor, and each rank maps its peers' slabs. Every setup step ends with an
exchange of failure flags, so either every rank enables the runtime or every
rank disables it and logs why.

Collectives are declared before use (:meth:`AllReduce.declare`): each declared
invocation is routed (spec §5.2) to the one-shot, fused or two-shot kernel, or
declined; equal declarations share one prepared plan, held in
:attr:`AllReduce.plans` (a :class:`~b12x.comm.pcie.DeclaredPlans`). A live call
is admitted once (:meth:`AllReduce.admit`: one metadata read, one exact-key
lookup, one bind) into an :class:`~b12x._core.AllReduceCall` whose ``run()``
launches exactly that; anything undeclared declines to the next backend
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from b12x import _core
from b12x._core import AllReduceCall
from b12x.comm.pcie import handshake, knobs
from b12x.comm.pcie.declared import DeclaredPlans
from b12x.comm.pcie.handshake import DeviceLike
from b12x.comm.pcie.invocation import FUSED, PLAIN, Declaration
from b12x.comm.pcie.knobs import Limits
from b12x.errors import B12xError, UndeclaredPlanError

__all__ = ["AllReduce", "decline"]

log = logging.getLogger("b12x.comm.pcie")


def decline(*args: Any, **kwargs: Any) -> None:
    """The admission of a runtime that runs nothing: every call declines."""
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
    every admission declines. Bad arguments and knobs are read first and agreed
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

    Attributes
    ----------
    plans
        The declared plans (:class:`~b12x.comm.pcie.DeclaredPlans`):
        ``plans.has_plan_for(t)``, ``plans.plan_for(t)``, ``plans.declared_plans``.
    admit
        ``admit(inp, operation=PLAIN, weight=None, epsilon=None, residual=None,
        out=None, residual_out=None)``: the :class:`~b12x._core.AllReduceCall`
        of this call if it runs here, else None; never raises. One native
        call (the runtime's admission over :attr:`plans`): one read of
        ``inp``'s metadata, the exact-key lookup (operation, shape, dtype,
        address strides; for :data:`FUSED` the weight's identity and epsilon),
        one bind by b12x-core (device, 16-byte alignment, layout; for
        :data:`FUSED` ``residual`` with ``residual_out`` None meaning
        ``residual``, ``weight`` and ``out``, None meaning in place). A plain
        call without ``out`` gets a fresh one like ``inp``. ``call.run()``
        launches exactly the admitted launch and returns ``call.out``.
    """

    plans: DeclaredPlans
    admit: Callable[..., AllReduceCall | None]

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
        self.group: dist.ProcessGroup | None = resolved
        self.enabled = False
        self.disabled_reason: str | None = None
        self._rt: _core.IpcAllReduce | None = None
        self._closed = False
        self.admit = decline

        # 1. arguments and knobs, read before any collective; a bad one fails
        #    'validate' for every rank and is raised here after the agreement
        settings: handshake.Settings | None = None
        error: B12xError | None = None
        try:
            settings = handshake.read_settings(device, limits, timeout_s, twoshot_push)
        except B12xError as e:
            error = e
        here = handshake.cuda_device(None) if settings is None else settings.device
        self._hs: handshake.Handshake | None = handshake.Handshake(
            resolved, self.rank, self.world_size, handshake.comm_device(resolved, here)
        )
        why = self._hs.agree(
            "validate", error or handshake.environment_error(self.world_size, here.index)
        )
        if settings is None:
            assert error is not None
            raise error
        self.device = settings.device
        self.limits = settings.limits
        self.timeout_s = settings.timeout_ns * 1e-9
        self.twoshot_push: bool | None = settings.twoshot_push  # None until set-up decides
        self.plans = DeclaredPlans(self.world_size, self.limits)  # routing only until open
        if why is not None:
            self._disable(why)
            return

        # 2. the two-shot transport (collective when auto), then the runtime
        ordinal = self.device.index
        if self.twoshot_push is None:
            self.twoshot_push = self._hs.all_pairs_nvlink(ordinal)
        rt, why = handshake.open_runtime(
            self._hs, ordinal, self.limits, self.twoshot_push, settings.timeout_ns,
            settings.fail_rank,
        )  # fmt: skip
        if rt is None:
            self._disable(why or "set-up failed")
            return
        self._open(rt)
        log.info(
            "b12x IPC all-reduce enabled on rank %d/%d (cuda:%d, slab %d bytes, %s, two-shot %s)",
            self.rank,
            self.world_size,
            ordinal,
            rt.slab_bytes,
            self.limits,
            "push" if self.twoshot_push else "pull",
        )

    def _open(self, rt: _core.IpcAllReduce) -> None:
        """Enables the runtime over ``rt``: its declared plans sized for it, its admission."""
        self._rt = rt
        self.plans = DeclaredPlans(
            self.world_size,
            self.limits,
            multiprocessors=rt.multiprocessors,
            twoshot_push=bool(self.twoshot_push),
        )
        rt.attach(self.plans.index)
        self.admit = rt.admit  # the native method itself: no Python frame per call
        self.enabled = True

    @classmethod
    def host_stand_in(
        cls,
        world: int = 2,
        *,
        rank: int = 0,
        limits: Limits | None = None,
        device: str = "cpu",
        on_launch: Callable[[AllReduceCall], object] | None = None,
    ) -> AllReduce:
        """An enabled AllReduce without a process group whose device side is
        host memory (:meth:`b12x._core.IpcAllReduce.host_stand_in`): declaring,
        admission, bind and the health read are the real ones; a launch is
        counted (:meth:`runtime_launches`) and handed to ``on_launch``, if
        given, instead of being enqueued. For ``b12x bench host`` and tests
        on machines without GPUs."""
        self = cls.__new__(cls)
        self.rank, self.world_size, self.group, self._hs = rank, world, None, None
        self.limits = Limits() if limits is None else limits
        self.device = torch.device(device)
        self.timeout_s = knobs.timeout_ns(None) * 1e-9
        self.twoshot_push = False
        self.disabled_reason, self._closed = None, False
        self._open(
            _core.IpcAllReduce.host_stand_in(device, rank, world, self.limits, on_launch=on_launch)
        )
        return self

    def runtime_launches(self) -> int | None:
        """Launches the host stand-in took (None for a real runtime or once closed)."""
        return None if self._rt is None else self._rt.stand_in_launches

    def _disable(self, why: str) -> None:
        self.enabled = False
        self.disabled_reason = why
        self.admit = decline
        log.warning("b12x IPC all-reduce disabled on rank %d: %s", self.rank, why)

    # ------------------------------------------------------------- declarations
    def declare(self, invocations: Iterable[Declaration]) -> None:
        """Route and prepare declared invocations; replaces earlier declarations.

        Each invocation carries ``name``, ``operation`` (:data:`PLAIN` or
        :data:`FUSED`), ``shape``, ``dtype``, ``strides`` (None = contiguous),
        ``norm_weight`` and ``epsilon`` (fused). Declined invocations are
        logged at debug level and their live calls decline. Every rank must
        declare the same invocations. The index is swapped in one step, so a
        concurrent lookup sees the old declarations or the new ones. A
        disabled runtime declares nothing (every lookup misses).
        """
        if not self.enabled:
            self.plans.clear()
            return
        self.plans.declare(invocations)

    # ------------------------------------------------------------- live calls
    def _call(self, operation: str, inp: torch.Tensor, *operands: Any) -> AllReduceCall:
        """The admitted call, or the precise error saying why it does not run here."""
        rt = self._rt
        if not self.enabled or rt is None:
            raise UndeclaredPlanError(
                f"PCIe collective has no declared plan for {operation}: the runtime is "
                f"disabled ({self.disabled_reason or 'closed'})"
            )
        try:
            return rt.admit_or_raise(inp, operation, *operands)
        except UndeclaredPlanError as e:
            if _capturing():
                raise UndeclaredPlanError(
                    f"cold (undeclared) plan cannot be captured in a CUDA graph: {e}"
                ) from None
            raise

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """Sum ``inp`` over the group into ``out`` (default: a new tensor) on
        torch's current stream; every rank gets identical bits.

        Raises :class:`b12x.errors.UndeclaredPlanError` for an undeclared call
        or a disabled or closed runtime, and the operand's error (device,
        alignment, layout) for a call the launch refuses.
        """
        result: torch.Tensor = self._call(PLAIN, inp, None, None, None, out).run()
        return result

    def fused_add_rms_norm(
        self,
        inp: torch.Tensor,
        residual: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        out: torch.Tensor | None = None,
        residual_out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``r = allreduce(inp) + residual``; ``residual_out = r``;
        ``out = r * rsqrt(mean(r^2) + eps) * weight`` (fp32 math, one rounding
        each). Defaults are in place: ``out=inp``, ``residual_out=residual``.
        Raises as :meth:`all_reduce` does."""
        call = self._call(FUSED, inp, weight, eps, residual, out, residual_out)
        call.run()
        fused = call.fused_operands
        assert fused is not None
        return call.out, fused[2]

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Scope of a CUDA graph capture on the caller's stream. Refuses to
        start without declared plans; a no-op when the runtime is disabled."""
        if self.enabled and len(self.plans) == 0:
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
        self.admit = decline
        self.plans.clear()
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
            f"{state}, plans={len(self.plans)})"
        )
