"""The GPU-timing helpers' bookkeeping (b12x.bench.common.gpu_time_us and
b12x.bench.interleave), with a fake clock in place of CUDA events: which
calls are timed, how samples are divided, when it waits. No real time is
measured."""

from __future__ import annotations

import pytest
from b12x.bench.common import gpu_time_us
from b12x.bench.interleave import ArmTimer, time_interleaved_us


class FakeGpu:
    """A stream whose clock advances only when work is enqueued on it."""

    def __init__(self) -> None:
        self.now_ms = 0.0
        self.log: list[str] = []

    def run(self, ms: float, what: str) -> None:
        self.now_ms += ms
        self.log.append(what)

    def event(self) -> FakeEvent:
        return FakeEvent(self)

    def synchronize(self) -> None:
        self.log.append("sync")


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.at_ms: float | None = None

    def record(self) -> None:
        self.at_ms = self.gpu.now_ms
        self.gpu.log.append("record")

    def synchronize(self) -> None:
        self.gpu.log.append("wait")

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at_ms is not None and end.at_ms is not None, "read before recorded"
        return end.at_ms - self.at_ms


def time_with(gpu: FakeGpu, step, samples: int, **kw) -> list[float]:
    return gpu_time_us(step, samples, event=gpu.event, synchronize=gpu.synchronize, **kw)


def test_each_sample_is_the_time_between_its_events_per_operation():
    gpu = FakeGpu()
    durations = iter([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])  # ms, one per step call
    got = time_with(gpu, lambda: gpu.run(next(durations), "step"), 3, repeat=2, per_step=5)
    # sample i covers steps 2i and 2i+1; ms -> us, divided by repeat * per_step
    assert got == [(1 + 2) * 1e3 / 10, (3 + 4) * 1e3 / 10, (5 + 6) * 1e3 / 10]


def test_warmup_and_flush_are_outside_the_timed_region():
    gpu = FakeGpu()
    got = time_with(
        gpu,
        lambda: gpu.run(2.0, "step"),
        2,
        warmup=3,
        flush=lambda: gpu.run(100.0, "flush"),
    )
    assert got == [2000.0, 2000.0]
    assert gpu.log == ["step"] * 3 + ["sync"] + ["flush", "record", "step", "record"] * 2 + ["sync"]


def test_back_to_back_samples_wait_once_and_sync_each_waits_per_sample():
    gpu = FakeGpu()
    time_with(gpu, lambda: gpu.run(1.0, "step"), 4)
    assert gpu.log.count("sync") == 1 and "wait" not in gpu.log
    gpu = FakeGpu()
    time_with(gpu, lambda: gpu.run(1.0, "step"), 4, sync_each=True)
    assert gpu.log == ["record", "step", "record", "wait"] * 4 + ["sync"]


def test_no_warmup_means_no_leading_wait():
    gpu = FakeGpu()
    assert time_with(gpu, lambda: gpu.run(0.5, "step"), 1) == [500.0]
    assert gpu.log == ["record", "step", "record", "sync"]


# --- arms timed in turn (b12x.bench.interleave) -----------------------------------------------


def interleaved(gpu: FakeGpu, steps, samples, **kw) -> list[list[float]]:
    return time_interleaved_us(steps, samples, event=gpu.event, synchronize=gpu.synchronize, **kw)


def arm(gpu: FakeGpu, name: str, ms: float):
    return lambda: gpu.run(ms, name)


def test_arms_take_turns_and_each_sample_times_only_its_own_arm():
    gpu = FakeGpu()
    got = interleaved(
        gpu, [arm(gpu, "a", 1.0), arm(gpu, "b", 2.0), arm(gpu, "c", 3.0)], [2, 2, 2],
        flush=lambda: gpu.run(50.0, "flush"),
    )  # fmt: skip
    assert got == [[1000.0, 1000.0], [2000.0, 2000.0], [3000.0, 3000.0]]
    steps = [s for s in gpu.log if s in "abc"]
    # round 0 from a, round 1 from b: no arm always follows the same one
    assert steps == ["a", "b", "c", "b", "c", "a"]
    assert gpu.log.count("flush") == 6 and gpu.log.count("sync") == 1
    assert gpu.log[:4] == ["flush", "record", "a", "record"]


def test_an_arm_with_fewer_samples_drops_out_of_the_later_rounds():
    gpu = FakeGpu()
    got = interleaved(gpu, [arm(gpu, "a", 1.0), arm(gpu, "t", 9.0)], [3, 1], rotate=False)
    assert got == [[1000.0] * 3, [9000.0]]
    assert [s for s in gpu.log if s in ("a", "t")] == ["a", "t", "a", "a"]


def test_the_counts_must_match_the_steps():
    with pytest.raises(ValueError, match="samples expected 2 counts, got 1"):
        interleaved(FakeGpu(), [lambda: None, lambda: None], [3])


def test_arm_timer_fills_samples_only_when_run_then_finishes_in_order():
    gpu = FakeGpu()
    captured: list[str] = []

    def capture(fn):
        fn()  # the capture's warm-up run
        captured.append("captured")
        return fn

    timer = ArmTimer(2, capture=capture, event=gpu.event, synchronize=gpu.synchronize)
    a = timer(arm(gpu, "a", 1.0))
    b = timer(arm(gpu, "b", 4.0), 1)
    seen: list[tuple[str, list[float]]] = []
    timer.then(lambda: seen.append(("a", list(a))))
    timer.then(lambda: seen.append(("b", list(b))))
    assert a == [] and b == [] and seen == [] and captured == ["captured"] * 2
    timer.run()
    assert seen == [("a", [1000.0, 1000.0]), ("b", [4000.0])]
    gpu.log.clear()
    b.rerun()  # one more replay of b's step, waited for
    assert gpu.log == ["b", "sync"]
    with pytest.raises(RuntimeError, match="declared after run"):
        timer(arm(gpu, "c", 1.0))
    with pytest.raises(RuntimeError, match="twice"):
        timer.run()


def test_arm_timer_keeps_each_arm_alive_while_its_graph_can_replay():
    """A graph keeps raw pointers into what its arm owns (a binding, its
    scratch); were the arm freed after the capture, the allocator would hand
    that memory to the next tensor and the replays would overwrite it."""
    import gc
    import weakref

    gpu = FakeGpu()

    class Owner:  # stands in for a binding whose scratch the graph writes
        def __call__(self) -> None:
            gpu.run(1.0, "owner")

    timer = ArmTimer(1, capture=lambda fn: (lambda: gpu.run(1.0, "replay")),
                     event=gpu.event, synchronize=gpu.synchronize)  # fmt: skip
    owner = Owner()
    alive = weakref.ref(owner)
    samples = timer(owner)
    del owner
    gc.collect()
    assert alive() is not None, "the arm was freed while its graph can still replay"
    timer.run()
    assert list(samples) == [1000.0] and alive() is not None
    del timer
    gc.collect()
    assert alive() is None, "the timer keeps its arms only as long as it lives"
