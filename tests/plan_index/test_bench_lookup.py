"""`b12x bench lookup`: its reference ports behave as spec §4 says, and it reports every arm."""

from __future__ import annotations

import json

import pytest
import torch
from b12x.bench.lookup_baselines import DictCommunicator, ScanCommunicator, ScanError
from b12x.cli import main
from b12x.comm.pcie import DeclaredPlanIndex, Invocation


def communicators(invocations):
    invs = {inv.name: inv for inv in invocations}
    plans = {name: f"plan-{name}" for name in invs}
    scan = ScanCommunicator.__new__(ScanCommunicator)
    scan._invocations, scan._plans = invs, plans
    index = DictCommunicator.__new__(DictCommunicator)
    index._invocations, index._plans = invs, plans
    index._index_declared_plans()
    b12x = DeclaredPlanIndex([(inv, plans[name]) for name, inv in invs.items()])
    return scan, index, b12x


def test_the_ports_agree_with_b12x_except_where_the_scan_used_exact_strides():
    w = torch.ones(8)
    scan, index, b12x = communicators(
        [
            Invocation(name="a", operation="all_reduce", shape=(1, 8), dtype=torch.bfloat16),
            Invocation(name="b", operation="all_reduce", shape=(2, 8), dtype=torch.bfloat16),
            Invocation(
                name="f",
                operation="all_reduce_fused_add_rms_norm",
                shape=(2, 8),
                dtype=torch.bfloat16,
                norm_weight=w,
                epsilon=1e-6,
            ),
        ]
    )
    fused = {"operation": "all_reduce_fused_add_rms_norm", "weight": w, "epsilon": 1e-6}
    cases = [
        (torch.empty((2, 8), dtype=torch.bfloat16), {}, True),
        (torch.empty((3, 8), dtype=torch.bfloat16), {}, False),
        (torch.empty((2, 8), dtype=torch.float16), {}, False),
        (torch.empty((2, 8), dtype=torch.bfloat16), fused, True),
        (torch.empty((2, 8), dtype=torch.bfloat16), {**fused, "weight": w.clone()}, False),
    ]
    for tensor, kw, expected in cases:
        assert scan._has_plan_for(tensor, **kw) is expected
        assert index._has_plan_for(tensor, **kw) is expected
        assert (
            b12x.has_plan_for(tensor, kw.get("operation"), kw.get("weight"), kw.get("epsilon"))
            is expected
        )
    # a trimmed (1, 8) view with a padded row stride: the scan compared exact strides
    trimmed = torch.empty((4, 10), dtype=torch.bfloat16)[:1, :8]
    assert trimmed.stride() == (10, 1)
    assert scan._has_plan_for(trimmed) is False
    assert index._has_plan_for(trimmed) is True
    assert b12x.has_plan_for(trimmed) is True


def test_the_scan_raises_with_every_declaration_on_a_miss():
    invocations = [
        Invocation(name=str(r), operation="all_reduce", shape=(r, 16), dtype=torch.bfloat16)
        for r in range(1, 41)
    ]
    scan, _, _ = communicators(invocations)
    with pytest.raises(ScanError, match="no declared plan for") as info:
        scan._plan_for(torch.empty((41, 16), dtype=torch.bfloat16))
    assert "all_reduce(40, 16)" in str(info.value)  # O(N): all of them


def test_the_bench_reports_every_arm_and_case(tmp_path, capsys):
    out = tmp_path / "lookup.json"
    argv = ["bench", "lookup", "--declarations", "3", "8", "--iterations", "2", "--repeats", "2"]
    assert main([*argv, "--warmup", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {(r["declarations"], r["case"], r["arm"]): r for r in doc["results"]}
    assert set(rows) == {
        (n, case, arm)
        for n in (3, 8)
        for case in ("hit", "miss")
        for arm in ("scan", "dict", "b12x")
    }
    assert all(len(r["samples_us"]) == 2 and r["median_us"] > 0 for r in rows.values())
    assert {"python", "cpu", "source_hash"} <= set(doc["meta"])
    printed = capsys.readouterr().out
    assert "b12x max/min over N" in printed
    assert "b12x/dict" in printed


def test_the_default_sweep_stops_at_4096_and_the_full_one_is_an_option():
    from b12x.bench import lookup
    from b12x.cli import build_parser

    args = build_parser().parse_args(["bench", "lookup"])
    assert args.declarations is None and not args.full
    assert lookup.DEFAULT_N == (64, 512, 4096) and lookup.FULL_N[-1] == 65536
    assert build_parser().parse_args(["bench", "lookup", "--full"]).full
    with pytest.raises(SystemExit) as exc:  # one or the other, never one silently dropped
        build_parser().parse_args(["bench", "lookup", "--full", "--declarations", "4"])
    assert exc.value.code == 2


def test_progress_goes_to_stderr_one_line_per_arm(capsys):
    argv = ["bench", "lookup", "--declarations", "3", "--iterations", "2", "--repeats", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split(":")[0].strip() for line in err] == [
        f"N=3 {case} {arm}" for case in ("hit", "miss") for arm in ("scan", "dict", "b12x")
    ]
