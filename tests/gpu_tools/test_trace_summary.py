"""tools/gpu/trace_summary.py: a trace build's printf lines grouped by call and kind."""

from __future__ import annotations

import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import trace_summary  # noqa: E402

LINES = """\
== call 0
HPTRACE fp8 cta 1 wg 0 t0 100 prologue 900 first 2100 wait 3000 pages 4
HPTRACE fp8 cta 2 wg 1 t0 120 prologue 1000 first 2300 wait 2000 pages 5
HPTRACE f16 cta 1 wg 0 t0 100 prologue 700 first 1900 wait 10 pages 4
some other output
== call 1
SGTRACE part 6 last 0 t0 1 wait 1312 hist 1344
""".splitlines()


def test_lines_group_by_call_and_flavor_and_keep_every_field():
    groups = trace_summary.parse(LINES)
    assert set(groups) == {
        ("call 0", "HPTRACE fp8"),
        ("call 0", "HPTRACE f16"),
        ("call 1", "SGTRACE"),
    }
    fp8 = groups[("call 0", "HPTRACE fp8")]
    assert fp8["prologue"] == [900, 1000]
    assert fp8["pages"] == [4, 5]
    assert groups[("call 0", "HPTRACE f16")]["wait"] == [10]
    assert groups[("call 1", "SGTRACE")]["hist"] == [1344]


def test_main_prints_each_groups_median(tmp_path, capsys, monkeypatch):
    path = tmp_path / "trace.txt"
    path.write_text("\n".join(LINES) + "\n")
    monkeypatch.setattr(sys, "argv", ["trace_summary.py", str(path)])
    assert trace_summary.main() == 0
    out = capsys.readouterr().out
    assert "== call 0: HPTRACE fp8 (2 lines)" in out
    assert "prologue   median          950" in out
    assert "cta" not in out.split("(2 lines)")[1].split("==")[0]  # identities are not summarised
