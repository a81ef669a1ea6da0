"""Arms of one bench case timed in turn, so that every arm sees the same clocks.

Timing arms one after another (all samples of one, then the next) biases the
comparison: under sustained FP8 load an H200's SM clock drifts down over a
case, so the later arms run slower (bench-results/h200/indexer-round19-notes.md:
the whole fast prefill call read 2012 us sequential, 1848 us interleaved). Here
each arm is captured in its CUDA graph when it is declared, and the samples are
taken in rounds, one replay of every arm a round, the L2 flushed before each,
the order rotated by one arm every round so that no arm always follows the
same one.

The timer keeps every arm's callable (and so whatever it owns: a binding and
its scratch) alive as long as the timer: a captured graph holds raw device
pointers, and a buffer freed while its graph still replays would be handed to
the next allocation of its size, which the replays then overwrite.

Arms declare what they do with their samples (:meth:`ArmTimer.then`); those
finishes run after the timing, in the order they were declared. Arms that
share output buffers re-run their graph (:meth:`Samples.rerun`) before they
check what it wrote.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from b12x.bench.common import TimingEvent, capture_graph, cuda_event, cuda_synchronize

if TYPE_CHECKING:
    import torch


def time_interleaved_us(
    steps: Sequence[Callable[[], object]],
    samples: Sequence[int],
    *,
    flush: Callable[[], object] | None = None,
    rotate: bool = True,
    event: Callable[[], TimingEvent] = cuda_event,
    synchronize: Callable[[], object] = cuda_synchronize,
) -> list[list[float]]:
    """GPU microseconds per call of every step, ``samples[i]`` samples of
    step ``i``, taken in rounds: round ``r`` runs each step that still needs
    samples once, starting at step ``r % len(steps)`` when ``rotate``. Each
    sample is a pair of CUDA events around one call, ``flush`` before it,
    outside its events; one synchronize ends them all."""
    if len(steps) != len(samples):
        raise ValueError(
            f"time_interleaved_us: samples expected {len(steps)} counts, got {len(samples)}"
        )
    pairs: list[list[tuple[TimingEvent, TimingEvent]]] = [[] for _ in steps]
    n = len(steps)
    for r in range(max(samples, default=0)):
        first = r % n if rotate else 0
        for j in range(n):
            i = (first + j) % n
            if r >= samples[i]:
                continue
            if flush is not None:
                flush()
            start, end = event(), event()
            start.record()
            steps[i]()
            end.record()
            pairs[i].append((start, end))
    synchronize()
    return [[s.elapsed_time(e) * 1e3 for s, e in arm] for arm in pairs]


class Samples(list[float]):
    """An arm's samples (empty until :meth:`ArmTimer.run`), and its graph."""

    def __init__(self, replay: Callable[[], object], synchronize: Callable[[], object]) -> None:
        super().__init__()
        self._replay = replay
        self._synchronize = synchronize

    def rerun(self) -> None:
        """One more replay, waited for: the arm's outputs are its own again."""
        self._replay()
        self._synchronize()


@dataclass(frozen=True)
class _Arm:
    """A declared arm: ``fn`` is kept because its graph (``step``) writes
    into what it owns; ``count`` samples go to ``samples``."""

    fn: Callable[[], object]
    step: Callable[[], object]
    count: int
    samples: Samples


class ArmTimer:
    """The arms of one case: ``timer(fn)`` captures ``fn`` in a CUDA graph now
    (running it once first, outside the capture), keeps ``fn`` alive with the
    graph, and returns its :class:`Samples`; :meth:`run` times every arm interleaved, then runs the
    finishes. ``capture`` makes a step of ``fn`` (tests pass fakes)."""

    def __init__(
        self,
        samples: int,
        flush: Callable[[], object] | None = None,
        *,
        capture: Callable[[Callable[[], object]], Callable[[], object]] | None = None,
        event: Callable[[], TimingEvent] = cuda_event,
        synchronize: Callable[[], object] = cuda_synchronize,
    ) -> None:
        self.samples = samples
        self.flush = flush
        self._capture = capture or _graph_step
        self._event = event
        self._synchronize = synchronize
        self._arms: list[_Arm] = []
        self._finishes: list[Callable[[], object]] = []
        self.ran = False

    def __call__(self, fn: Callable[[], object], samples: int | None = None) -> Samples:
        if self.ran:
            raise RuntimeError("ArmTimer: an arm declared after run(); declare every arm first")
        step = self._capture(fn)
        out = Samples(step, self._synchronize)
        self._arms.append(_Arm(fn, step, self.samples if samples is None else samples, out))
        return out

    def then(self, finish: Callable[[], object]) -> None:
        """``finish`` runs after the timing, after the finishes declared before it."""
        self._finishes.append(finish)

    def run(self) -> None:
        if self.ran:
            raise RuntimeError("ArmTimer: run() twice")
        self.ran = True
        timed = time_interleaved_us(
            [arm.step for arm in self._arms],
            [arm.count for arm in self._arms],
            flush=self.flush,
            event=self._event,
            synchronize=self._synchronize,
        )
        for arm, got in zip(self._arms, timed, strict=True):
            arm.samples.extend(got)
        for finish in self._finishes:
            finish()


def _graph_step(fn: Callable[[], object]) -> Callable[[], Any]:
    graph: torch.cuda.CUDAGraph = capture_graph(fn)
    graph.replay()  # the first replay uploads the graph: untimed, as time_graph_us's warm-up
    return graph.replay
