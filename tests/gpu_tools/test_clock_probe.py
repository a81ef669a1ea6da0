"""tools/gpu/clock_probe.py: nvidia-smi's samples parsed and assigned to the phase they fall in."""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import clock_probe  # noqa: E402


def smi_line(t: float, mhz: int, watts: float, reasons: str = "0x0000000000000004") -> str:
    stamp = dt.datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
    return f"{stamp}, {mhz}, 1980, {watts}, 55, {reasons}"


def test_rows_parse_with_epoch_times_and_bad_lines_are_dropped():
    t = 1_796_493_632.25
    text = "\n".join(
        [smi_line(t, 1695, 690.5), "No devices were found", smi_line(t + 0.02, 1650, 698.25)]
    )
    rows = clock_probe.parse(text)
    assert [r["sm_mhz"] for r in rows] == [1695.0, 1650.0]
    assert abs(rows[0]["t"] - t) < 1e-3
    assert rows[1]["power_w"] == 698.25
    assert rows[0]["reasons"] == "0x0000000000000004"


def test_a_phase_takes_the_median_of_its_samples_after_the_settling_time():
    t0 = 1_796_493_700.0
    phase = {
        "precision": "exact",
        "t0": t0,
        "t1": t0 + 1.0,
        "settle_s": clock_probe.SETTLE_S,
        "calls": 300,
        "mean_call_us": 3200.0,
    }
    samples = clock_probe.parse(
        "\n".join(
            [
                smi_line(t0 + 0.1, 1980, 300.0, "0x0000000000000000"),  # settling: left out
                smi_line(t0 + 0.5, 1695, 690.0),
                smi_line(t0 + 0.6, 1680, 700.0),
                smi_line(t0 + 0.7, 1710, 695.0),
                smi_line(t0 + 2.0, 345, 70.0, "0x0000000000000001"),  # after the phase
            ]
        )
    )
    out = clock_probe.summarize(phase, samples)
    assert out["samples"] == 3
    assert out["sm_mhz"] == 1695.0
    assert out["power_w"] == 695.0
    assert out["reasons"] == ["0x0000000000000004"]
    assert out["mean_call_us"] == 3200.0


def test_a_phase_without_samples_says_so():
    phase = {
        "precision": "fast",
        "t0": 10.0,
        "t1": 11.0,
        "settle_s": clock_probe.SETTLE_S,
        "calls": 5,
        "mean_call_us": 2000.0,
    }
    out = clock_probe.summarize(phase, [])
    assert out["samples"] == 0
    assert "sm_mhz" not in out
