"""Single-node all-reduce over CUDA IPC: one-shot, fused add + RMSNorm, two-shot.

:class:`AllReduce` is built collectively from a torch.distributed process group
(one process per GPU, one node). Every rank allocates an IPC slab, the 64-byte
handles travel over the group as a uint8 tensor, and each rank maps its peers'
slabs. Every setup step ends with an exchange of failure flags, so either every
rank enables the runtime or every rank disables it and logs why.

Collectives are declared before use (:meth:`AllReduce.declare`): each declared
invocation is routed (spec §5.2) to the one-shot, fused or two-shot kernel, or
declined; equal declarations share one prepared plan. Live calls look their
plan up by an exact key (:meth:`AllReduce.has_plan_for` /
:meth:`AllReduce.plan_for`); anything undeclared declines to the next backend
(NCCL). Kernels launch on torch's current stream and choose their staging
slot on the device, so a captured CUDA graph replays correctly after its inputs
are rewritten.

Limits (inclusive byte ceilings, spec §5.1 grammar: ``17``, ``84KB``, ``6 MiB``,
``2g``; ``KB`` is KiB) come from the constructor or the environment:

========================================================  ==========  =============================
variable                                                  default     meaning
========================================================  ==========  =============================
``VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE``                  512 KiB     plain one-shot ceiling; 0: off
``VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE``         512 KiB     fused ceiling; 0: off
``VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE``                  32 MiB      bf16 two-shot ceiling; off/0
``VLLM_PCIE_TWOSHOT_ROW_ELEMS``                           4096        two-shot needs numel %
                                                                      (world * row_elems) == 0
``B12X_ALLREDUCE_TIMEOUT_S``                              60          bound of every cross-GPU wait
``B12X_ALLREDUCE_TWOSHOT_PUSH``                           auto        two-shot transport: 1 push,
                                                                      0 pull, auto: push iff every
                                                                      pair has native P2P atomics
                                                                      (NVLink), else pull (PCIe)
========================================================  ==========  =============================

The defaults come from ``b12x bench allreduce --gpus 2`` on NVLink H200s
(graph replay, bf16): the one-shot takes 5.0-6.6 us for 8-256 KiB against
NCCL's 12.2-14.0, 8.0 us at 512 KiB and 10.1 us at 1 MiB (still ahead of the
push two-shot's 11.4), so its ceiling sits far above the reference's PCIe
default of 84 KB; the fused kernel is 6.3-7.0 us for 1-16 rows x 7168. The
slab of each rank holds two staging slots of the largest ceiling (the push
two-shot stages twice its bytes: 128 MiB + 8.5 KiB per rank with the
defaults).

Graph and stream contract: one AllReduce is used by one stream at a time, in
the same order on every rank (the epoch that selects slots advances per
launch); captured graphs hold only kernel nodes, so replays need no host work.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from b12x import _core
from b12x._core import DeclaredPlanIndex, invocation_key
from b12x.errors import UndeclaredPlanError

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
    "Limits",
    "parse_byte_size",
    "prepare_declarations",
    "route",
]

log = logging.getLogger("b12x.comm.pcie")

PLAIN = "all_reduce"
FUSED = "all_reduce_fused_add_rms_norm"

ENV_ONESHOT_MAX = "VLLM_PCIE_ONESHOT_ALLREDUCE_MAX_SIZE"
ENV_FUSED_MAX = "VLLM_PCIE_ONESHOT_FUSED_ADD_RMS_NORM_MAX_SIZE"
ENV_TWOSHOT_MAX = "VLLM_PCIE_TWOSHOT_ALLREDUCE_MAX_SIZE"
ENV_TWOSHOT_ROW_ELEMS = "VLLM_PCIE_TWOSHOT_ROW_ELEMS"
ENV_TIMEOUT = "B12X_ALLREDUCE_TIMEOUT_S"
ENV_TWOSHOT_PUSH = "B12X_ALLREDUCE_TWOSHOT_PUSH"
# Test hook: the rank named here fails its slab allocation (proves that one
# rank's setup failure disables the runtime on every rank).
ENV_FAIL_SETUP_RANK = "B12X_ALLREDUCE_TEST_FAIL_SETUP_RANK"

DEFAULT_ONESHOT_MAX = 512 << 10
DEFAULT_FUSED_MAX = 512 << 10
DEFAULT_TWOSHOT_MAX = 32 << 20
DEFAULT_TWOSHOT_ROW_ELEMS = 4096
DEFAULT_TIMEOUT_S = 60.0


def parse_byte_size(text: str) -> int:
    """Parse a byte size: ``"17"`` -> 17, ``"84KB"`` -> 86016, ``"6 MiB"`` -> 6291456.

    Suffixes b, k/kb/kib, m/mb/mib, g/gb/gib, t/tb/tib (case-insensitive; KB is
    KiB). Raises :class:`b12x.errors.ConfigError` (a ValueError) on a bad suffix
    ("invalid byte-size suffix") or text that is no size ("invalid byte size").
    """
    return _core.allreduce_parse_byte_size(text)


@dataclasses.dataclass(frozen=True)
class Limits:
    """Inclusive byte ceilings of each route (0 turns a route off)."""

    oneshot_max: int = DEFAULT_ONESHOT_MAX
    fused_max: int = DEFAULT_FUSED_MAX
    twoshot_max: int = DEFAULT_TWOSHOT_MAX
    twoshot_row_elems: int = DEFAULT_TWOSHOT_ROW_ELEMS

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"Limits: {field.name} expected a non-negative int, got {value!r}")
        if self.twoshot_row_elems == 0:
            raise ValueError("Limits: twoshot_row_elems expected a positive int, got 0")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Limits:
        """Limits from the spec's environment knobs, defaults where unset."""
        env = os.environ if env is None else env

        def size(name: str, default: int, optional: bool = False) -> int:
            text = env.get(name)
            if text is None:
                return default
            if optional:
                return _core.allreduce_parse_optional_byte_size(text)
            value = parse_byte_size(text)
            if value < 0:
                raise ValueError(f"{name}: expected a non-negative byte size, got {text!r}")
            return value

        row = env.get(ENV_TWOSHOT_ROW_ELEMS)
        return cls(
            oneshot_max=size(ENV_ONESHOT_MAX, DEFAULT_ONESHOT_MAX),
            fused_max=size(ENV_FUSED_MAX, DEFAULT_FUSED_MAX),
            twoshot_max=size(ENV_TWOSHOT_MAX, DEFAULT_TWOSHOT_MAX, optional=True),
            twoshot_row_elems=DEFAULT_TWOSHOT_ROW_ELEMS if row is None else int(row),
        )

    def slot_bytes(self, twoshot_push: bool = False) -> int:
        """Bytes one staging slot must hold (the push two-shot stages data
        twice: received shards and gathered results)."""
        twoshot = self.twoshot_max * (2 if twoshot_push else 1)
        return max(self.oneshot_max, self.fused_max, twoshot, 16)

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.oneshot_max, self.fused_max, self.twoshot_max, self.twoshot_row_elems)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def route_with_reason(
    operation: str,
    shape: tuple[int, ...],
    dtype: Any,
    strides: tuple[int, ...] | None,
    world: int,
    limits: Limits,
) -> tuple[str | None, str]:
    """(route, "") or (None, why): "oneshot", "oneshot_fused" or "twoshot"."""
    return _core.allreduce_route(
        operation,
        list(shape),
        _dtype_name(dtype),
        None if strides is None else list(strides),
        world,
        limits.as_tuple(),
    )


def route(
    operation: str,
    shape: tuple[int, ...],
    dtype: Any,
    strides: tuple[int, ...] | None,
    world: int,
    limits: Limits,
) -> str | None:
    """The route of a declaration (spec §5.2), or None when it declines to NCCL."""
    return route_with_reason(operation, shape, dtype, strides, world, limits)[0]


def prepare_declarations(
    invocations: Iterable[Any],
    world: int,
    limits: Limits,
    multiprocessors: int,
    twoshot_push: bool = False,
) -> tuple[list[tuple[Any, Any]], list[tuple[Any, str]]]:
    """Route every invocation and prepare one plan per distinct declaration.

    ``invocations`` carry ``operation``, ``shape``, ``dtype``, ``strides``
    (None = contiguous). Returns ``(routed, declined)``: routed is
    ``[(invocation, plan)]`` in declaration order, where equal declarations
    (route, shape, dtype, address strides) share one ``_core.AllReducePlan``;
    declined is ``[(invocation, why)]``. ``twoshot_push`` picks the two-shot
    transport. Pure host logic: no GPU needed.
    """
    plans: dict[tuple[Any, ...], Any] = {}
    routed: list[tuple[Any, Any]] = []
    declined: list[tuple[Any, str]] = []
    for inv in invocations:
        shape = tuple(inv.shape)
        strides = None if inv.strides is None else tuple(inv.strides)
        name, why = route_with_reason(inv.operation, shape, inv.dtype, strides, world, limits)
        if name is None:
            declined.append((inv, why))
            continue
        # equal declarations (route, shape, dtype, address strides) share one plan
        key = (name, *invocation_key(inv)[1:4])
        plan = plans.get(key)
        if plan is None:
            plan = _core.AllReducePlan(
                name, list(shape), _dtype_name(inv.dtype), world, multiprocessors, twoshot_push
            )
            plans[key] = plan
        routed.append((inv, plan))
    return routed, declined


def _backend_device(group: Any, device: Any) -> Any:
    import torch.distributed as dist

    return device if "nccl" in str(dist.get_backend(group)) else "cpu"


def _host_id() -> int:
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:7], "little")


class AllReduce:
    """One rank's CUDA-IPC all-reduce over a torch.distributed group.

    Construction is collective (every rank of ``group`` must call it, in the
    same order as their other collectives). If any setup step fails on any
    rank, ``enabled`` is False on every rank, ``disabled_reason`` says why, and
    every lookup declines.

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
        Bound of every cross-GPU wait (default ``B12X_ALLREDUCE_TIMEOUT_S`` or
        60 s). A wait that exceeds it records an error that surfaces as
        :class:`b12x.errors.CollectiveTimeoutError` instead of a hang.
    twoshot_push
        Two-shot transport: True, peers store their shards into the owner's
        slot (fast over NVLink, slow SM peer writes over PCIe); False, the owner
        pulls them from the peers' staged copies (the reference protocol).
        None: ``B12X_ALLREDUCE_TWOSHOT_PUSH`` (0, 1 or auto, the default:
        push iff every pair of GPUs has native P2P atomics, i.e. NVLink).
    """

    def __init__(
        self,
        group: Any = None,
        *,
        device: Any = None,
        limits: Limits | None = None,
        timeout_s: float | None = None,
        twoshot_push: bool | None = None,
    ) -> None:
        import torch
        import torch.distributed as dist

        from b12x.cuda import device_index

        self.group = dist.group.WORLD if group is None else group
        self.rank = dist.get_rank(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.device = torch.device("cuda", device_index("cuda" if device is None else device))
        self.limits = Limits.from_env() if limits is None else limits
        if timeout_s is None:
            timeout_s = float(os.environ.get(ENV_TIMEOUT, DEFAULT_TIMEOUT_S))
        if not timeout_s > 0:
            raise ValueError(f"AllReduce: timeout_s expected > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        if twoshot_push is None:
            choice = os.environ.get(ENV_TWOSHOT_PUSH, "auto").strip().lower()
            if choice not in ("0", "1", "auto"):
                raise ValueError(f"{ENV_TWOSHOT_PUSH}: expected 0, 1 or auto, got {choice!r}")
            twoshot_push = None if choice == "auto" else choice == "1"
        self.twoshot_push: bool | None = twoshot_push  # None until setup decides (auto)
        self.enabled = False
        self.disabled_reason: str | None = None
        self._ordinal = self.device.index
        self._comm_device = _backend_device(self.group, self.device)
        self._rt: Any = None
        self._index = DeclaredPlanIndex([])
        self._declared: list[tuple[Any, Any]] = []
        self._closed = False
        self._setup()

    # ------------------------------------------------------------- setup
    def _agree(self, step: str, error: BaseException | None) -> bool:
        """Exchange this rank's failure flag for `step`; True if no rank failed."""
        import torch
        import torch.distributed as dist

        flag = torch.tensor(
            [0 if error is None else 1], dtype=torch.int32, device=self._comm_device
        )
        flags = [torch.empty_like(flag) for _ in range(self.world_size)]
        dist.all_gather(flags, flag, group=self.group)
        failed = [r for r, f in enumerate(flags) if int(f.item()) != 0]
        if not failed:
            return True
        why = f"setup step '{step}' failed on rank(s) {failed}"
        if error is not None:
            why += f" (here: {type(error).__name__}: {error})"
        self._disable(why)
        return False

    def _disable(self, why: str) -> None:
        self.enabled = False
        self.disabled_reason = why
        log.warning("b12x IPC all-reduce disabled on rank %d: %s", self.rank, why)

    def _contract(self) -> list[int]:
        return [
            _host_id(),
            self.world_size,
            *self.limits.as_tuple(),
            round(self.timeout_s * 1e9),
            int(bool(self.twoshot_push)),
        ]

    def _setup(self) -> None:
        import torch
        import torch.distributed as dist

        # 1. local checks, then every rank must agree on the contract
        error: BaseException | None = None
        try:
            if not 2 <= self.world_size <= 8:
                raise ValueError(f"world size expected 2..8, got {self.world_size}")
            if not _core.driver_present():
                raise RuntimeError("no CUDA driver")
        except Exception as e:
            error = e
        if not self._agree("validate", error):
            return
        if self.twoshot_push is None:
            self.twoshot_push = self._all_pairs_nvlink()
        mine = torch.tensor(self._contract(), dtype=torch.int64, device=self._comm_device)
        theirs = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(theirs, mine, group=self.group)
        error = None
        if any(not torch.equal(t, theirs[0]) for t in theirs):
            error = ValueError(
                "ranks disagree on (host, world, limits, timeout): "
                f"{[t.tolist() for t in theirs]} (one node, equal limits required)"
            )
        if not self._agree("contract", error):
            return

        # 2. own slab (zeroed before its handle exists) + host error word
        error = None
        try:
            if os.environ.get(ENV_FAIL_SETUP_RANK) == str(self.rank):
                raise RuntimeError(f"{ENV_FAIL_SETUP_RANK}={self.rank} (test hook)")
            self._rt = _core.IpcAllReduce(
                self._ordinal,
                self.rank,
                self.world_size,
                self.limits.slot_bytes(bool(self.twoshot_push)),
                round(self.timeout_s * 1e9),
            )
        except Exception as e:
            error = e
        if not self._agree("allocate", error):
            self._free_local()
            return

        # 3. exchange handles as plain bytes, open the peers' slabs
        handle = torch.frombuffer(bytearray(self._rt.handle()), dtype=torch.uint8)
        handle = handle.to(self._comm_device)
        handles = [torch.empty_like(handle) for _ in range(self.world_size)]
        dist.all_gather(handles, handle, group=self.group)
        error = None
        try:
            self._rt.open_peers([bytes(h.cpu().tolist()) for h in handles])
        except Exception as e:
            error = e
        if not self._agree("open peers", error):
            # every rank closes what it opened before anyone frees its slab
            with contextlib.suppress(Exception):
                self._rt.close_peers()
            self._agree("rollback", None)
            self._free_local()
            return
        self.enabled = True
        log.info(
            "b12x IPC all-reduce enabled on rank %d/%d (cuda:%d, slab %d bytes, limits %s, "
            "two-shot %s)",
            self.rank,
            self.world_size,
            self._ordinal,
            self._rt.slab_bytes,
            self.limits,
            "push" if self.twoshot_push else "pull",
        )

    def _all_pairs_nvlink(self) -> bool:
        """True iff every rank sees native P2P atomics to every peer (NVLink)."""
        import torch
        import torch.distributed as dist

        try:
            mine = _core.pci_bus_id(self._ordinal).encode()[:31]
        except Exception:
            mine = b""  # unknown: no peer can match it, so the verdict is pull
        ids = torch.frombuffer(bytearray(mine.ljust(32, b"\0")), dtype=torch.uint8)
        ids = ids.to(self._comm_device)
        gathered = [torch.empty_like(ids) for _ in range(self.world_size)]
        dist.all_gather(gathered, ids, group=self.group)
        verdict = bool(mine)
        for r, t in enumerate(gathered):
            if r != self.rank and verdict:
                bus = bytes(t.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
                try:
                    verdict = _core.p2p_native_atomics(self._ordinal, bus) is True
                except Exception:
                    verdict = False
        flag = torch.tensor([int(verdict)], dtype=torch.int32, device=self._comm_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def _free_local(self) -> None:
        if self._rt is not None:
            with contextlib.suppress(Exception):
                self._rt.free()
            self._rt = None

    # ------------------------------------------------------------- declarations
    def declare(self, invocations: Iterable[Any]) -> None:
        """Route and prepare declared invocations; replaces earlier declarations.

        Each invocation carries ``name``, ``operation`` ("all_reduce" or
        "all_reduce_fused_add_rms_norm"), ``shape``, ``dtype``, ``strides``
        (None = contiguous), ``norm_weight`` and ``epsilon`` (fused). Declined
        invocations are logged at debug level and their live calls decline.
        Every rank must declare the same invocations.
        """
        invocations = list(invocations)
        if not self.enabled:
            self._declared = []
            self._index = DeclaredPlanIndex([])
            return
        routed, declined = prepare_declarations(
            invocations,
            self.world_size,
            self.limits,
            self._rt.multiprocessors,
            bool(self.twoshot_push),
        )
        for inv, why in declined:
            log.debug("b12x IPC all-reduce declines %s: %s", getattr(inv, "name", inv), why)
        self._declared = routed
        self._index = DeclaredPlanIndex(routed)

    @property
    def declared_plans(self) -> list[tuple[Any, Any]]:
        """(invocation, plan) of every routed declaration, in declaration order."""
        return list(self._declared)

    def has_plan_for(
        self, inp: Any, operation: str = PLAIN, weight: Any = None, epsilon: float | None = None
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
        self, inp: Any, operation: str = PLAIN, weight: Any = None, epsilon: float | None = None
    ) -> Any:
        """The declared plan of this call; raises UndeclaredPlanError if none."""
        if not self.enabled:
            raise UndeclaredPlanError(
                f"PCIe collective has no declared plan for {operation}: the runtime is "
                f"disabled ({self.disabled_reason or 'closed'})"
            )
        try:
            return self._index.plan_for(inp, operation, weight, epsilon)
        except UndeclaredPlanError as e:
            if _capturing():
                raise UndeclaredPlanError(
                    f"cold (undeclared) plan cannot be captured in a CUDA graph: {e}"
                ) from None
            raise

    # ------------------------------------------------------------- live calls
    def all_reduce(self, inp: Any, out: Any = None, *, plan: Any = None) -> Any:
        """Sum ``inp`` over the group into ``out`` (default: a new tensor) on
        torch's current stream; every rank gets identical bits.

        ``plan``: the declared plan of this call when the caller already looked
        it up (an adapter's admission does); None looks it up. The launch
        checks ``inp`` and ``out`` against the plan either way."""
        if plan is None:
            plan = self.plan_for(inp)
        if out is None:
            import torch

            out = torch.empty_like(inp)
        self._rt.run(plan, inp, out, _core_stream(self._ordinal))
        return out

    def fused_add_rms_norm(
        self,
        inp: Any,
        residual: Any,
        weight: Any,
        eps: float,
        out: Any = None,
        residual_out: Any = None,
        *,
        plan: Any = None,
    ) -> tuple[Any, Any]:
        """``r = allreduce(inp) + residual``; ``residual_out = r``;
        ``out = r * rsqrt(mean(r^2) + eps) * weight`` (fp32 math, one rounding
        each). Defaults are in place: ``out=inp``, ``residual_out=residual``.
        ``plan`` as for :meth:`all_reduce`."""
        if plan is None:
            plan = self.plan_for(inp, FUSED, weight, eps)
        out = inp if out is None else out
        residual_out = residual if residual_out is None else residual_out
        self._rt.run_fused(
            plan, inp, residual, weight, eps, out, residual_out, _core_stream(self._ordinal)
        )
        return out, residual_out

    @contextlib.contextmanager
    def capture(self) -> Iterator[None]:
        """Scope of a CUDA graph capture on the caller's stream. Refuses to
        start without declared plans; a no-op when the runtime is disabled."""
        if self.enabled and not self._declared:
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
        import torch

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
        self._declared = []
        self._index = DeclaredPlanIndex([])
        if self._rt is None:
            return
        import torch

        timed_out = self._rt.error_code() != 0
        with contextlib.suppress(Exception):
            torch.cuda.synchronize(self.device)
        if not was_enabled or timed_out:
            with contextlib.suppress(Exception):
                self._rt.close_peers()
            self._rt = None
            return
        error: BaseException | None = None
        self._agree("close: device idle", None)
        try:
            self._rt.close_peers()
        except Exception as e:
            error = e
        self._agree("close: peers unmapped", error)
        try:
            self._rt.free()
        except Exception as e:
            log.warning("b12x IPC all-reduce: freeing the slab on rank %d failed: %s", self.rank, e)
        self._rt = None

    def __repr__(self) -> str:
        state = "enabled" if self.enabled else f"disabled ({self.disabled_reason})"
        return (
            f"AllReduce(rank={self.rank}, world={self.world_size}, device={self.device}, "
            f"{state}, plans={len(self._index)})"
        )


def _capturing() -> bool:
    """Whether torch's current stream is capturing a CUDA graph (False without CUDA)."""
    import torch

    try:
        return torch.cuda.is_current_stream_capturing()
    except Exception:
        return False


def _core_stream(ordinal: int) -> int:
    import torch

    return torch._C._cuda_getCurrentRawStream(ordinal)
