"""The SM clock and board power while one indexer case runs back to back, per precision.

python3 tools/gpu/clock_probe.py [--seconds S] [--json OUT] [case]

The tensor-pipe floors in the notes assume the rated clock; a scorer that keeps
the tensor pipe busy for milliseconds can hold the board at its power limit,
and the SMs then run slower. This runs each precision's call eagerly for S
seconds (a synchronize every 8 calls, so the queue stays short) while
`nvidia-smi` samples every 20 ms, then gives each phase's median SM clock, power
and active clock-event reasons over its samples (a call phase without its first
0.3 s, while the clock settles; the idle second before them whole), and
the call's mean time over the phase.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import subprocess
import tempfile
import time

import torch
from b12x.attention import dsa_indexer as di
from indexer_profile import case_binding

FIELDS = (
    "timestamp",
    "clocks.sm",
    "clocks.max.sm",
    "power.draw",
    "temperature.gpu",
    "clocks_event_reasons.active",
)
SETTLE_S = 0.3


def sampler(log) -> subprocess.Popen:
    """nvidia-smi sampling into `log` (a file: a pipe left unread fills and stalls it)."""
    return subprocess.Popen(
        [
            "nvidia-smi",
            "-i",
            str(torch.cuda.current_device()),
            f"--query-gpu={','.join(FIELDS)}",
            "--format=csv,noheader,nounits",
            "-lms",
            "20",
        ],
        stdout=log,
    )


def parse(lines: str) -> list[dict]:
    """nvidia-smi's CSV rows as dicts, the timestamp as epoch seconds (local time, as printed)."""
    rows = []
    for line in lines.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(FIELDS):
            continue
        try:
            t = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            rows.append(
                {
                    "t": t,
                    "sm_mhz": float(parts[1]),
                    "max_sm_mhz": float(parts[2]),
                    "power_w": float(parts[3]),
                    "temp_c": float(parts[4]),
                    "reasons": parts[5],
                }
            )
        except ValueError:
            continue
    return rows


def run_phase(case: str, precision: str, seconds: float) -> dict:
    binding = case_binding(case, precision)
    di.run(binding)
    torch.cuda.synchronize()
    t0, calls = time.time(), 0
    while time.time() - t0 < seconds:
        di.run(binding)
        calls += 1
        if calls % 8 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    t1 = time.time()
    return {
        "precision": precision,
        "t0": t0,
        "t1": t1,
        "settle_s": SETTLE_S,
        "calls": calls,
        "mean_call_us": (t1 - t0) / calls * 1e6,
    }


def summarize(phase: dict, samples: list[dict]) -> dict:
    """The phase's medians over its samples from t0 + settle_s to t1."""
    inside = [s for s in samples if phase["t0"] + phase["settle_s"] <= s["t"] <= phase["t1"]]
    out = {k: phase[k] for k in ("precision", "calls", "mean_call_us")}
    out["samples"] = len(inside)
    if inside:
        for key in ("sm_mhz", "max_sm_mhz", "power_w", "temp_c"):
            out[key] = statistics.median(s[key] for s in inside)
        out["reasons"] = sorted({s["reasons"] for s in inside})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("case", nargs="?", default="prefill_r4096_L32768")
    args = ap.parse_args()
    with tempfile.TemporaryFile(mode="w+") as log:
        smi = sampler(log)
        idle_t0 = time.time()
        time.sleep(1.0)  # idle samples before the first phase, for the idle clock
        idle = {
            "precision": "idle",
            "t0": idle_t0,
            "t1": time.time(),
            "settle_s": 0.0,
            "calls": 0,
            "mean_call_us": None,
        }
        phases = [idle] + [run_phase(args.case, p, args.seconds) for p in ("fast", "exact")]
        smi.terminate()
        smi.wait()
        log.seek(0)
        samples = parse(log.read())
    report = {
        "case": args.case,
        "device": torch.cuda.get_device_name(),
        "phases": [summarize(p, samples) for p in phases],
        "raw": samples,
    }
    for p in report["phases"]:
        print(json.dumps(p))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
