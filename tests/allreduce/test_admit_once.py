"""One all-reduce through vLLM's slot reads, binds and checks once (issue 20, item 1).

The runtime is b12x's own over its host stand-in: declaring, admission, bind
and the health read are the real ones; a launch is counted instead of
enqueued. The input is a tensor subclass that counts its metadata reads (a
subclass takes the attribute path, whose last read is ``data_ptr()``).
"""

from __future__ import annotations

import b12x
import pytest
import torch
from b12x.comm.pcie import FUSED, PLAIN, AllReduce, Invocation
from b12x.integration.vllm.communicator import B12xCustomAllreduce

SHAPE = (4, 256)


class Counted(torch.Tensor):
    """Counts ``data_ptr()`` reads of each tensor object (by id)."""

    reads: dict[int, int] = {}  # noqa: RUF012 (a shared tally, reset per test)

    def data_ptr(self) -> int:
        Counted.reads[id(self)] = Counted.reads.get(id(self), 0) + 1
        return super().data_ptr()


class VllmOwn:
    """vLLM's own CustomAllreduce behind b12x: takes nothing here."""

    disabled = False

    def should_custom_ar(self, inp):
        return False

    def close(self):
        pass


def slot_over_stand_in():
    runtime = AllReduce.host_stand_in(2)
    weight = torch.ones(SHAPE[1])
    runtime.declare(
        [
            Invocation("m", PLAIN, SHAPE, torch.float32),
            Invocation("f", FUSED, SHAPE, torch.float32, norm_weight=weight, epsilon=1e-6),
        ]
    )
    return B12xCustomAllreduce.from_parts(VllmOwn(), runtime), runtime, weight


def vllm_all_reduce(slot, x):
    """What CudaCommunicator.all_reduce asks of its custom all-reduce slot."""
    if not slot.disabled and slot.should_custom_ar(x):
        return slot.custom_all_reduce(x)
    return None


def test_a_slot_all_reduce_reads_its_input_once_binds_once_and_launches_once():
    slot, runtime, _ = slot_over_stand_in()
    rt = runtime._rt
    x = torch.ones(SHAPE).as_subclass(Counted)
    Counted.reads = {}
    for calls in range(1, 4):
        out = vllm_all_reduce(slot, x)
        assert out is not None and out is not x and out.shape == x.shape
        assert Counted.reads[id(x)] == calls  # one metadata read per call
        assert rt.stand_in_launches == calls  # one bind, launched once
        assert rt.stand_in_health_reads == calls  # one read of the error word, at the launch
    slot.close()


def test_a_declined_call_reads_once_and_launches_nothing():
    slot, runtime, _ = slot_over_stand_in()
    x = torch.ones((3, 256)).as_subclass(Counted)  # undeclared
    Counted.reads = {}
    assert vllm_all_reduce(slot, x) is None
    assert Counted.reads[id(x)] == 1
    assert runtime._rt.stand_in_launches == 0 and runtime._rt.stand_in_health_reads == 0


def test_the_fused_call_is_admitted_once_and_runs_its_own_launch():
    slot, runtime, weight = slot_over_stand_in()
    x = torch.ones(SHAPE)
    residual = torch.zeros(SHAPE)
    call = runtime.admit(x, FUSED, weight, 1e-6, residual)
    assert call is not None and call.fused_operands is not None
    assert call.out is x and call.fused_operands[2] is residual  # in place by default
    assert call.plan is runtime.plans.plan_for(x, FUSED, weight, 1e-6)
    assert call.run() is x and runtime._rt.stand_in_launches == 1
    slot.close()


def test_a_recorded_timeout_refuses_the_launch():
    slot, runtime, _weight = slot_over_stand_in()
    call = runtime.admit(torch.ones(SHAPE))
    assert runtime._rt._stand_in_record_error(0x101)  # timed out waiting for rank 1
    with pytest.raises(b12x.CollectiveTimeoutError, match="for rank 1"):
        call.run()
    assert runtime._rt.stand_in_launches == 0
    slot.close()


def test_dropping_the_slot_closes_its_runtime():
    slot, runtime, _weight = slot_over_stand_in()
    assert runtime.enabled
    del slot
    assert not runtime.enabled and runtime.disabled_reason == "closed"
