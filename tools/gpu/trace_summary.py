"""Medians of a trace build's printf stamps, per call: `trace_call.py`'s output.

    python3 tools/gpu/trace_summary.py trace.txt

Lines `KEY name value name value ...` (integers) from the kernels of a
diagnostic build (`HPTRACE` from `scorer-trace`, `SGTRACE` from
`select-trace`, `SCTRACE` from round 37's `trace_select.py` and round 38's
`trace_pick.py`) are grouped by the `== call N` line before them and by KEY
plus any non-numeric word after it (a flavor); each field's median, minimum
and maximum over the lines of a group are printed.
"""

from __future__ import annotations

import statistics
import sys
from collections import defaultdict


def parse(lines: list[str]) -> dict[tuple[str, str], dict[str, list[int]]]:
    groups: dict[tuple[str, str], dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    call = "-"
    for line in lines:
        words = line.split()
        if not words:
            continue
        if words[0] == "==":
            call = " ".join(words[1:])
            continue
        if not words[0].endswith("TRACE"):
            continue
        key, rest = words[0], words[1:]
        tag = []
        while rest and len(rest) % 2 == 1:  # a flavor word before the name/value pairs
            tag.append(rest.pop(0))
        fields = groups[(call, " ".join([key, *tag]))]
        for name, value in zip(rest[::2], rest[1::2], strict=True):
            if value.lstrip("-").isdigit():
                fields[name].append(int(value))
    return groups


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        groups = parse(f.readlines())
    for (call, key), fields in groups.items():
        n = max(len(v) for v in fields.values())
        print(f"== {call}: {key} ({n} lines)")
        for name, values in fields.items():
            if name in ("t0", "cta", "part", "wg"):
                continue
            med = statistics.median(values)
            print(f"  {name:10} median {med:12.0f}  min {min(values):12d}  max {max(values):12d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
