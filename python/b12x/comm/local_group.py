"""One process per GPU on one node: the group set-up b12x's own benchmarks,
demo and tests share.

NVLink multicast stays off in every such process: b12x's collectives never
use it, and on a shared multi-GPU host a program that sets it up can take the
host's GPUs out of service. NCCL, torch SymmetricMemory and NVSHMEM read these
variables when they initialise, so :func:`init_local_group` sets them first.
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

__all__ = ["NVLS_OFF", "free_port", "init_local_group"]

NVLS_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}

# A rank that fails or diverges must not hold its peers for NCCL's default
# 10 minutes.
DEFAULT_TIMEOUT_S = 60.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def init_local_group(
    rank: int,
    world: int,
    port: int,
    *,
    backend: str = "nccl",
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Joins the default process group of ``world`` local processes.

    With ``backend="nccl"`` the process binds to ``cuda:<rank>`` first.
    Rendezvous is over TCP on 127.0.0.1:``port``; waits are bounded by
    ``timeout_s``.
    """
    import torch
    import torch.distributed as dist

    os.environ.update(NVLS_OFF)
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device_id = torch.device("cuda", rank)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
        device_id=device_id,
    )
