"""scripts/same_metrics.py: two metrics files with the same numbers pass, any other value or key fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "same_metrics.py"
STEPS = [
    {"step": 1, "reward": 0.5, "time/step": 2.0},
    {"step": 2, "reward": 0.625, "perf/tokens_per_s": 900.0},
]


def compare(tmp_path: Path, after: list[dict]) -> subprocess.CompletedProcess:
    files = []
    for name, rows in (("before", STEPS), ("after", after)):
        files.append(tmp_path / f"{name}.jsonl")
        files[-1].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return subprocess.run([sys.executable, SCRIPT, *map(str, files)], capture_output=True, text=True)


def test_wall_clock_keys_may_differ(tmp_path: Path) -> None:
    timed = [{**STEPS[0], "time/step": 9.0}, {**STEPS[1], "perf/tokens_per_s": 1.0}]
    done = compare(tmp_path, timed)
    assert done.returncode == 0 and "4 values compared" in done.stdout and "0 differences" in done.stdout


def test_a_value_a_key_or_a_step_that_differs_fails(tmp_path: Path) -> None:
    changed = compare(tmp_path, [STEPS[0], {**STEPS[1], "reward": 0.6250001}])
    assert changed.returncode == 1 and "step 2: reward 0.625 -> 0.6250001" in changed.stdout
    extra = compare(tmp_path, [{**STEPS[0], "entropy": 0.1}, STEPS[1]])
    assert extra.returncode == 1 and "step 1: the keys differ (['entropy'])" in extra.stdout
    assert "2 lines against 1" in compare(tmp_path, STEPS[:1]).stdout


def test_how_far_the_replicas_ran_ahead_is_timing_but_staleness_is_not(tmp_path: Path) -> None:
    ahead = [{**STEPS[0], "async/queue_depth": 1.0, "async/groups_in_flight": 8.0}, STEPS[1]]
    ran = [{**STEPS[0], "async/queue_depth": 0.0, "async/groups_in_flight": 0.0}, STEPS[1]]
    rows = [("before", ahead), ("after", ran)]
    paths = []
    for name, records in rows:
        paths.append(tmp_path / f"{name}.jsonl")
        paths[-1].write_text("".join(json.dumps(r) + "\n" for r in records))
    done = subprocess.run([sys.executable, SCRIPT, *map(str, paths)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout
    stale = compare(tmp_path, [{**STEPS[0], "async/staleness_max": 1.0}, STEPS[1]])
    assert stale.returncode == 1 and "async/staleness_max" in stale.stdout
