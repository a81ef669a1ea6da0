"""Hostile input to the IPC all-reduce's host side (issue 13, items 5 and 6):
every refusal is a B12xError naming the argument, field or variable, and a
bad argument on one rank is agreed over the group before anyone uses it, so
no peer is left waiting. CPU only (gloo, no GPU)."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path

import pytest
import torch
from b12x.comm import pcie
from b12x.comm.local_group import free_port, init_local_group
from b12x.comm.pcie import allreduce as ar
from b12x.comm.pcie import handshake, knobs
from b12x.errors import B12xError, ConfigError, DeviceError, UndeclaredPlanError
from test_allreduce_routing import TP2, Inv, _stand_in


# ------------------------------------------------------------- item 5: calls on a dead runtime
@pytest.mark.parametrize("how", ["disabled", "closed"])
def test_a_disabled_or_closed_runtime_refuses_a_call_cleanly(how):
    runtime = _stand_in(limits=TP2)
    weight = torch.ones(6144, dtype=torch.bfloat16)
    runtime.declare(
        [
            Inv("one", ar.PLAIN, (1, 6144), torch.bfloat16),
            Inv("fused", ar.FUSED, (4, 6144), torch.bfloat16, norm_weight=weight, epsilon=1e-6),
        ]
    )
    one = torch.empty(1, 6144, dtype=torch.bfloat16)
    x = torch.empty(4, 6144, dtype=torch.bfloat16)
    admitted = runtime.admit(one)
    assert admitted is not None
    if how == "disabled":
        runtime._disable("setup step 'allocate' failed")
    else:
        runtime.close()
    with pytest.raises(
        UndeclaredPlanError, match=f"disabled.*{'allocate' if how == 'disabled' else 'closed'}"
    ):
        runtime.all_reduce(one)
    with pytest.raises(UndeclaredPlanError, match="disabled"):
        runtime.fused_add_rms_norm(x, x.clone(), weight, 1e-6)
    assert runtime.admit(one) is None
    assert runtime.admit(x, ar.FUSED, weight, 1e-6, x.clone()) is None
    if how == "closed":  # a call admitted before the close does not run after it
        with pytest.raises(B12xError, match="open runtime"):
            admitted.run()


# ------------------------------------------------------------- item 5: timeouts
@pytest.mark.parametrize(
    "bad", [math.inf, -math.inf, math.nan, 1e300, 0, 0.0, -1, 3601, True, "60"]
)
def test_timeouts_are_finite_and_bounded(bad):
    with pytest.raises(
        ConfigError, match=r"AllReduce: timeout_s expected seconds, a finite number"
    ):
        knobs.timeout_ns(bad)


def test_timeout_knob_is_bounded_too():
    assert knobs.timeout_ns(2.5) == 2_500_000_000
    assert knobs.timeout_ns(None, {}) == 60_000_000_000
    assert knobs.timeout_ns(None, {knobs.ENV_TIMEOUT: " 30 "}) == 30_000_000_000
    for bad in ["inf", "1e300", "0", "-5", "soon", "nan"]:
        with pytest.raises(ConfigError, match=f'{knobs.ENV_TIMEOUT} expected seconds.*got "{bad}"'):
            knobs.timeout_ns(None, {knobs.ENV_TIMEOUT: bad})


def _bad_timeout_worker(rank, world, port, outdir):
    init_local_group(rank, world, port, backend="gloo")
    result = {}
    try:
        runtime = ar.AllReduce(device=0, timeout_s=math.inf if rank == 1 else 30.0)
        result = {"enabled": runtime.enabled, "reason": runtime.disabled_reason}
        runtime.close()
    except B12xError as e:
        result = {"error": type(e).__name__, "message": str(e)}
    import torch.distributed as dist

    dist.barrier()  # both ranks are past the constructor: nobody waits on the other
    Path(outdir, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo's static destructors may abort at exit


def test_a_bad_timeout_on_one_rank_is_agreed_before_use(tmp_path):
    """Rank 1 is given an infinite timeout: it raises ConfigError naming the
    argument, and only after the 'validate' agreement, so rank 0 disables
    (naming rank 1) instead of waiting for a peer that left."""
    import torch.multiprocessing as mp

    ctx = mp.spawn(_bad_timeout_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("a rank waited outside the agreement")
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r1["error"] == "ConfigError" and "timeout_s" in r1["message"], r1
    assert r0["enabled"] is False and "'validate' failed on rank(s)" in r0["reason"], r0
    assert "1]" in r0["reason"], r0


# ------------------------------------------------------------- item 5: limits
@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("oneshot_max", 2**64),
        ("oneshot_max", 2**40 + 1),
        ("fused_max", -1),
        ("twoshot_max", True),
        ("twoshot_max", 1.5),
        ("fused_max", "16KB"),
        ("twoshot_row_elems", 0),
        ("twoshot_row_elems", 2**31 + 1),
    ],
)
def test_out_of_range_limits_are_refused_at_construction(field, value):
    with pytest.raises(ConfigError, match=f"^Limits: {field} expected .*got {value!r}"):
        pcie.Limits(**{field: value})


def test_limits_are_one_core_struct():
    limits = pcie.Limits(16384, 73728, 786432, 896)
    assert limits == pcie.Limits.from_env(
        {
            knobs.ENV_ONESHOT_MAX: "16KB",
            knobs.ENV_FUSED_MAX: "72KB",
            knobs.ENV_TWOSHOT_MAX: "768KB",
            knobs.ENV_TWOSHOT_ROW_ELEMS: "896",
        }
    )
    assert hash(limits) == hash(pcie.Limits(16384, 73728, 786432, 896))
    assert pcie.Limits(2**40, 2**40, 2**40, 2**31).slot_bytes(twoshot_push=True) == 2**41
    assert "oneshot_max=16384" in repr(limits)
    import pickle

    assert pickle.loads(pickle.dumps(limits)) == limits
    assert pcie.Limits is knobs.Limits


# ------------------------------------------------------------- item 5: devices
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        "garbage",
        "cuda:300",
        "cuda:-1",
        "cuda:1.5",
        -1,
        128,
        300,
        True,
        1.5,
        torch.device("cpu"),
        [0],
    ],
)
def test_bad_devices_name_the_operand(device):
    expected = r"^AllReduce: device expected (a CUDA device|a torch|a CUDA ordinal)"
    with pytest.raises(DeviceError, match=expected):
        handshake.cuda_device(device)


def test_good_devices_resolve_to_their_ordinal():
    assert handshake.cuda_device(3) == torch.device("cuda", 3)
    assert handshake.cuda_device("cuda:7") == torch.device("cuda", 7)
    assert handshake.cuda_device(torch.device("cuda", 2)) == torch.device("cuda", 2)
    assert handshake.cuda_device(None).type == "cuda"


# ------------------------------------------------------------- item 6: environment knobs
GARBAGE = {
    knobs.ENV_ONESHOT_MAX: ["lots", "-1", "2t", "1.5k"],
    knobs.ENV_FUSED_MAX: ["12 parsecs", ""],
    knobs.ENV_TWOSHOT_MAX: ["auto", "-1"],
    knobs.ENV_TWOSHOT_ROW_ELEMS: ["0", "4k", "-8", "1e3"],
    knobs.ENV_TIMEOUT: ["soon", "inf"],
    knobs.ENV_TWOSHOT_PUSH: ["yes", "2"],
    knobs.ENV_FAIL_SETUP_RANK: ["one", "-1"],
}


def _read(var, env):
    if var == knobs.ENV_TIMEOUT:
        return knobs.timeout_ns(None, env)
    if var == knobs.ENV_TWOSHOT_PUSH:
        return knobs.twoshot_push(None, env)
    if var == knobs.ENV_FAIL_SETUP_RANK:
        return knobs.fail_setup_rank(env)
    return pcie.Limits.from_env(env)


@pytest.mark.parametrize(
    ("var", "text"), [(var, text) for var, texts in GARBAGE.items() for text in texts]
)
def test_every_knob_names_itself_and_its_accepted_form(var, text):
    with pytest.raises(
        ConfigError, match=rf'^AllReduce: {var} expected (?P<form>.+), got "{text}"$'
    ):
        _read(var, {var: text})


def test_every_knob_is_covered_and_reads_os_environ(monkeypatch):
    assert set(GARBAGE) == set(
        knobs.__dict__[name] for name in knobs.__all__ if name.startswith("ENV_")
    )
    monkeypatch.setenv(knobs.ENV_TWOSHOT_PUSH, "maybe")
    with pytest.raises(ConfigError, match=knobs.ENV_TWOSHOT_PUSH):
        knobs.twoshot_push(None)
    assert knobs.twoshot_push(False) is False  # an argument wins over the environment
    with pytest.raises(ConfigError, match="twoshot_push expected True, False or None"):
        knobs.twoshot_push(1)
    with pytest.raises(ConfigError, match=f"{knobs.ENV_TWOSHOT_PUSH} expected a string"):
        knobs.twoshot_push(None, {knobs.ENV_TWOSHOT_PUSH: 1})
