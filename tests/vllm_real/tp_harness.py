"""Two real vLLM ranks on CPU: a TP group of 2 over gloo, for tests that need one.

:class:`TpRanks` spawns the ranks once (importing vLLM costs seconds of CPU
per process), initialises vLLM's distributed state in each
(``init_distributed_environment`` + ``initialize_model_parallel``, gloo), and
then runs named scenario functions of :mod:`tp_scenarios` on every rank at
once: ``ranks.run("name", **kwargs)`` returns each rank's result, or raises
with the rank's traceback. Each wait is bounded, so a rank that hangs in a
collective fails the test instead of wedging the run.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

WAIT_S = 240.0  # first call includes vLLM's import in both ranks on a 2-core machine


class RankError(AssertionError):
    """A scenario raised on a rank (the message carries its traceback)."""


class TpRanks:
    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size
        context = multiprocessing.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="b12x-tp-")
        init = f"file://{Path(self._dir.name) / 'init'}"
        self._conns = []
        self._procs = []
        for rank in range(world_size):
            parent, child = context.Pipe()
            proc = context.Process(
                target=_serve,
                args=(rank, world_size, init, child, str(Path(__file__).parent)),
                daemon=True,
            )
            proc.start()
            child.close()
            self._conns.append(parent)
            self._procs.append(proc)

    def run(self, scenario: str, **kwargs: Any) -> list[Any]:
        """Runs ``tp_scenarios.<scenario>(rank, **kwargs)`` on every rank; their results."""
        for conn in self._conns:
            conn.send((scenario, kwargs))
        results, errors = [], []
        for rank, conn in enumerate(self._conns):
            if not conn.poll(WAIT_S):
                self.close()
                raise RankError(f"rank {rank} gave no answer to {scenario!r} in {WAIT_S:.0f} s")
            status, value = conn.recv()
            if status == "ok":
                results.append(value)
            else:
                errors.append(f"--- rank {rank} ---\n{value}")
        if errors:
            raise RankError(f"{scenario} failed:\n" + "\n".join(errors))
        return results

    def close(self) -> None:
        for conn in self._conns:
            with contextlib.suppress(OSError):  # a rank that already died
                conn.send(None)
        for proc in self._procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._conns, self._procs = [], []
        self._dir.cleanup()


def _serve(rank: int, world_size: int, init: str, conn: Any, here: str) -> None:
    """One rank: vLLM's distributed state, then scenarios until told to stop."""
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, here)
    sys.path.insert(1, str(Path(here).parent / "support"))  # vllm_fakes
    try:
        import tp_scenarios

        tp_scenarios.init_ranks(rank, world_size, init)
    except BaseException:
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        name, kwargs = message
        try:
            conn.send(("ok", getattr(tp_scenarios, name)(rank, **kwargs)))
        except BaseException:
            conn.send(("error", traceback.format_exc()))
