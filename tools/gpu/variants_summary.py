"""Medians of a `variants.sh` call: each run's, then each wheel's over its runs.

    python3 tools/gpu/variants_summary.py RESULTS NAME [NAME ...]

RESULTS holds `NAME-ROUND.json` from `b12x bench indexer --json`, one per
wheel and round. The first table has a column per run (round by round, each
round's wheels in the order named). The second has, for each case and arm,
each wheel's median over its rounds and its difference from the first
wheel's (the baseline): the figure a merge rule compares.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

Table = dict[tuple[str, str], dict[str, float]]  # (case, arm) -> run or wheel -> median


def load(results: Path, names: list[str]) -> tuple[list[str], Table]:
    """The runs (stems, ordered by round, then by the order of `names`) and
    each (case, arm)'s median by run."""
    runs = [p for p in results.glob("*-[0-9]*.json") if p.stem.rsplit("-", 1)[0] in names]
    runs.sort(key=lambda p: (int(p.stem.rsplit("-", 1)[1]), names.index(p.stem.rsplit("-", 1)[0])))
    table: Table = {}
    for path in runs:
        for r in json.loads(path.read_text())["results"]:
            if r.get("median_us") is not None:
                table.setdefault((r["case"], r["arm"]), {})[path.stem] = r["median_us"]
    return [p.stem for p in runs], table


def by_wheel(table: Table, names: list[str]) -> Table:
    """Each (case, arm)'s median over a wheel's runs, by wheel (wheels without
    a run of that arm left out)."""
    out: Table = {}
    for key, runs in table.items():
        for name in names:
            mine = [v for stem, v in runs.items() if stem.rsplit("-", 1)[0] == name]
            if mine:
                out.setdefault(key, {})[name] = statistics.median(mine)
    return out


def render(results: Path, names: list[str]) -> str:
    cols, table = load(results, names)
    lines = [f"{'case':22} {'arm':22} " + " ".join(f"{c:>12}" for c in cols)]
    for (case, arm), v in table.items():
        cells = " ".join(f"{v.get(c, float('nan')):12.2f}" for c in cols)
        lines.append(f"{case[:22]:22} {arm:22} {cells}")
    lines.append("")
    lines.append(f"medians over rounds, and the difference from {names[0]} (negative: faster)")
    lines.append(f"{'case':22} {'arm':22} " + " ".join(f"{n:>16}" for n in names))
    for (case, arm), v in by_wheel(table, names).items():
        base = v.get(names[0])
        cells = []
        for n in names:
            if n not in v:
                cells.append(f"{'-':>16}")
            elif n == names[0] or base is None:
                cells.append(f"{v[n]:16.2f}")
            else:
                cells.append(f"{v[n]:8.2f} {v[n] - base:+7.2f}")
        lines.append(f"{case[:22]:22} {arm:22} " + " ".join(cells))
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    print(render(Path(sys.argv[1]), sys.argv[2:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
