"""tools/gpu/variants_summary.py: each wheel's median over its rounds, beside the baseline's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parents[2] / "tools" / "gpu"
sys.path.insert(0, str(TOOLS))

import variants_summary as vs  # noqa: E402


def write_run(d: Path, stem: str, medians: dict[tuple[str, str], float | None]) -> None:
    results = [{"case": c, "arm": a, "median_us": m} for (c, a), m in medians.items()]
    (d / f"{stem}.json").write_text(json.dumps({"results": results}))


def test_runs_order_by_round_then_by_the_names_and_skip_other_files(tmp_path):
    for stem in ("new-2", "base-1", "new-1", "base-2", "other-1", "base-10"):
        write_run(tmp_path, stem, {("r1", "b12x"): 1.0})
    (tmp_path / "test_base.txt").write_text("log")
    cols, _ = vs.load(tmp_path, ["base", "new"])
    assert cols == ["base-1", "new-1", "base-2", "new-2", "base-10"]


def test_each_wheel_takes_the_median_of_its_rounds():
    table = {
        ("r1", "b12x"): {
            "base-1": 10.0,
            "base-2": 12.0,
            "base-3": 11.0,
            "new-1": 9.0,
            "new-2": 8.0,
        },
        ("r1", "topk"): {"new-1": 3.0},  # the baseline has no run of this arm
    }
    assert vs.by_wheel(table, ["base", "new"]) == {
        ("r1", "b12x"): {"base": 11.0, "new": 8.5},
        ("r1", "topk"): {"new": 3.0},
    }


def test_render_shows_each_wheels_difference_from_the_first(tmp_path):
    write_run(tmp_path, "base-1", {("r1", "b12x"): 20.0, ("r1", "skipped"): None})
    write_run(tmp_path, "base-2", {("r1", "b12x"): 22.0})
    write_run(tmp_path, "new-1", {("r1", "b12x"): 19.5})
    write_run(tmp_path, "new-2", {("r1", "b12x"): 19.0})
    out = vs.render(tmp_path, ["base", "new"])
    row = next(line for line in out.splitlines()[3:] if line.startswith("r1") and "b12x" in line)
    assert row.split()[2:] == ["21.00", "19.25", "-1.75"]
    assert "skipped" not in out  # arms without a median are not rows
