"""Collective set-up and teardown of the IPC all-reduce: the constructor's
arguments and knobs checked (:func:`read_settings`), then the steps.

Every rank of the group runs the same steps in the same order. Each step
that can fail on one rank ends with an all-rank exchange of failure flags
(:meth:`Handshake.agree`), so either every rank enables the runtime or every
rank disables it and logs why; no rank ever waits in a collective that a
peer has skipped. Handles and contracts travel as plain integer and byte
tensors over the group, never as pickled objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import socket
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from b12x import _core
from b12x.comm.pcie import knobs
from b12x.comm.pcie.knobs import ENV_FAIL_SETUP_RANK, Limits
from b12x.cuda import device_index
from b12x.errors import ConfigError, DeviceError

__all__ = [
    "Handshake",
    "Settings",
    "close_runtime",
    "comm_device",
    "cuda_device",
    "environment_error",
    "host_id",
    "open_runtime",
    "read_settings",
]

log = logging.getLogger("b12x.comm.pcie")

DeviceLike = torch.device | str | int


def cuda_device(device: DeviceLike | None) -> torch.device:
    """The CUDA device of ``device`` (:func:`b12x.cuda.device_index`'s grammar;
    None or a bare ``"cuda"``: torch's current device, cuda:0 without CUDA so
    the set-up can decline); a malformed one is a DeviceError naming AllReduce."""
    return torch.device("cuda", device_index(device, op="AllReduce"))


class Settings(NamedTuple):
    device: torch.device
    limits: Limits
    timeout_ns: int
    twoshot_push: bool | None  # None: auto, decided collectively
    fail_rank: int | None


def read_settings(
    device: DeviceLike | None,
    limits: Limits | None,
    timeout_s: float | None,
    twoshot_push: bool | None,
) -> Settings:
    """Every argument and knob of the constructor, checked (B12xError on a bad one)."""
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError(
            f"AllReduce: limits expected a b12x.comm.pcie.Limits, got {type(limits).__name__}"
        )
    return Settings(
        device=cuda_device(device),
        limits=Limits.from_env() if limits is None else limits,
        timeout_ns=knobs.timeout_ns(timeout_s),
        twoshot_push=knobs.twoshot_push(twoshot_push),
        fail_rank=knobs.fail_setup_rank(),
    )


def environment_error(world: int, ordinal: int) -> Exception | None:
    """Why this rank cannot run the all-reduce here, if it cannot."""
    try:
        _core.allreduce_check_world(world)
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


# Width of a PCI bus id on the wire ("0000:19:00.0" is 12 bytes).
_BUS_ID_BYTES = 32


def host_id() -> int:
    """A 56-bit id of this host (ranks on other hosts disagree on it)."""
    digest = hashlib.sha256(socket.gethostname().encode()).digest()
    return int.from_bytes(digest[:7], "little")


def comm_device(group: dist.ProcessGroup, device: torch.device) -> torch.device:
    """Where the group's tensors live: the CUDA device for NCCL, else the CPU."""
    return device if "nccl" in str(dist.get_backend(group)) else torch.device("cpu")


class Handshake:
    """One rank's side of the set-up collectives over ``group``."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world: int, device: torch.device):
        self.group = group
        self.rank = rank
        self.world = world
        self.device = device

    def _gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t, group=self.group)
        return out

    def agree(self, step: str, error: BaseException | None) -> str | None:
        """Exchanges this rank's failure flag for ``step``: None if no rank
        failed, else why (naming the failed ranks and this rank's error)."""
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int32, device=self.device)
        failed = [r for r, f in enumerate(self._gather(flag)) if int(f.item()) != 0]
        if not failed:
            return None
        why = f"setup step '{step}' failed on rank(s) {failed}"
        if error is not None:
            why += f" (here: {type(error).__name__}: {error})"
        return why

    def gather_ints(self, values: Sequence[int]) -> list[list[int]]:
        mine = torch.tensor(list(values), dtype=torch.int64, device=self.device)
        return [t.tolist() for t in self._gather(mine)]

    def gather_bytes(self, data: bytes) -> list[bytes]:
        mine = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        return [bytes(t.cpu().tolist()) for t in self._gather(mine)]

    def all_true(self, verdict: bool) -> bool:
        flag = torch.tensor([int(verdict)], dtype=torch.int32, device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())

    def all_pairs_nvlink(self, ordinal: int) -> bool:
        """True iff every rank sees native P2P atomics to every peer (NVLink)."""
        try:
            mine = _core.pci_bus_id(ordinal).encode()[: _BUS_ID_BYTES - 1]
        except Exception:
            mine = b""  # unknown: no peer can match it, so the verdict is pull
        verdict = bool(mine)
        for r, bus in enumerate(self.gather_bytes(mine.ljust(_BUS_ID_BYTES, b"\0"))):
            if r != self.rank and verdict:
                peer = bus.rstrip(b"\0").decode(errors="replace")
                try:
                    verdict = _core.p2p_native_atomics(ordinal, peer) is True
                except Exception:
                    verdict = False
        return self.all_true(verdict)


def open_runtime(
    hs: Handshake,
    ordinal: int,
    limits: Limits,
    twoshot_push: bool,
    timeout_ns: int,
    fail_rank: int | None,
) -> tuple[_core.IpcAllReduce | None, str | None]:
    """Allocates this rank's slab, exchanges handles and opens the peers'
    slabs, agreeing after each step: ``(runtime, None)`` on every rank, or
    ``(None, why)`` on every rank with nothing left allocated."""
    # the contract: every rank on one host, with the same limits and settings
    contract = [host_id(), hs.world, *limits.as_tuple(), timeout_ns, int(twoshot_push)]
    theirs = hs.gather_ints(contract)
    error: BaseException | None = None
    if any(t != theirs[0] for t in theirs):
        error = ValueError(
            "ranks disagree on (host, world, limits, timeout, two-shot transport): "
            f"{theirs} (one node, equal limits required)"
        )
    if why := hs.agree("contract", error):
        return None, why

    # own slab (zeroed before its handle exists) + host error word
    rt: _core.IpcAllReduce | None = None
    error = None
    try:
        if fail_rank == hs.rank:
            raise RuntimeError(f"{ENV_FAIL_SETUP_RANK}={hs.rank} (test hook)")
        rt = _core.IpcAllReduce(ordinal, hs.rank, hs.world, limits, twoshot_push, timeout_ns)
    except Exception as e:
        error = e
    if why := hs.agree("allocate", error):
        _free(rt)
        return None, why
    assert rt is not None

    # handles as plain bytes, then the peers' slabs
    handles = hs.gather_bytes(rt.handle())
    error = None
    try:
        rt.open_peers(handles)
    except Exception as e:
        error = e
    if why := hs.agree("open peers", error):
        # every rank closes what it opened before anyone frees its slab
        with contextlib.suppress(Exception):
            rt.close_peers()
        hs.agree("rollback", None)
        _free(rt)
        return None, why
    return rt, None


def _free(rt: _core.IpcAllReduce | None) -> None:
    if rt is not None:
        with contextlib.suppress(Exception):
            rt.free()


def close_runtime(
    hs: Handshake, rt: _core.IpcAllReduce, device: torch.device, healthy: bool
) -> None:
    """Releases ``rt``: collectively while every rank is ``healthy`` (device
    idle, every rank unmaps its peers, then every rank frees its own slab).
    Otherwise the peers cannot be trusted to take part: this rank unmaps its
    peers and keeps its own slab (a peer kernel may still read it)."""
    timed_out = rt.error_code() != 0
    with contextlib.suppress(Exception):
        torch.cuda.synchronize(device)
    if not healthy or timed_out:
        with contextlib.suppress(Exception):
            rt.close_peers()
        return
    hs.agree("close: device idle", None)
    error: BaseException | None = None
    try:
        rt.close_peers()
    except Exception as e:
        error = e
    hs.agree("close: peers unmapped", error)
    try:
        rt.free()
    except Exception as e:
        log.warning("b12x IPC all-reduce: freeing the slab on rank %d failed: %s", hs.rank, e)
