"""A stage that cannot learn (every ground truth unmatchable, so no group has reward variance) stops after
trainer.max_skipped_steps skipped steps with exit code 2 and the verifier's reasons, instead of reporting success."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from or1.errors import UserError
from or1.trainer.skipped import SkippedSteps
from run_files import tiny_run

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
ENV = {**os.environ, "COLUMNS": "1000"}


def test_the_limit_counts_skipped_steps_in_a_row_and_names_the_reasons() -> None:
    skipped = SkippedSteps(limit=3)
    skipped.count(1, {"reward/reason_wrong_answer": 0.75, "reward/reason_no_answer": 0.25})
    skipped.count(2, {"reward/reason_wrong_answer": 1.0})
    with pytest.raises(UserError) as err:
        skipped.count(3, {"reward/reason_wrong_answer": 0.5, "reward/reason_no_answer": 0.5})
    # over the three steps: (0.75 + 1 + 0.5) / 3 = 75% wrong_answer, (0.25 + 0.5) / 3 = 25% no_answer
    assert "3 steps in a row were skipped" in str(err.value)
    assert "up to step 3" in str(err.value)
    assert "verifier reasons: 75% wrong_answer, 25% no_answer" in str(err.value)
    assert "trainer.max_skipped_steps" in str(err.value)
    never = SkippedSteps(limit=0)
    for step in range(50):
        never.count(step + 1, {"reward/reason_wrong_answer": 1.0})
    assert never.in_a_row == 50


def test_the_skipped_count_goes_into_checkpoints_and_restarts_after_a_trained_step() -> None:
    skipped = SkippedSteps(limit=3)
    skipped.count(1, {"reward/reason_no_answer": 1.0})
    resumed = SkippedSteps(limit=3)
    resumed.load_state_dict(skipped.state_dict())
    assert (resumed.in_a_row, resumed.reasons) == (1, {"reward/reason_no_answer": 1.0})
    resumed.reset()
    assert (resumed.in_a_row, resumed.reasons) == (0, {})


def test_unmatchable_ground_truths_stop_the_stage_with_the_reasons(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    rows = pq.read_table(tiny_data_dir / "train.parquet").to_pylist()[:64]
    for row in rows:  # an integer no tiny arithmetic task produces
        row["reward_model"] = {**row["reward_model"], "ground_truth": '["-987654321"]'}
    data = tmp_path / "unmatchable.parquet"
    pq.write_table(pa.Table.from_pylist(rows), data)
    run_dir = tmp_path / "run"
    sets = tiny_run(
        tiny_model_dir,
        data,
        "trainer.steps=50",
        "trainer.max_skipped_steps=3",
        "data.validation.sets=[]",
    )
    args = ["train", "--recipe", RECIPE, "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)]]
    done = subprocess.run(
        [sys.executable, "-m", "or1.cli", *args], capture_output=True, text=True, timeout=600, env=ENV
    )

    assert done.returncode == 2, done.stderr[-3000:]
    error = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(error) == 1 and "3 steps in a row were skipped" in error[0], done.stderr[-3000:]
    assert "wrong_answer" in error[0] and "Traceback" not in done.stderr
    logged = [json.loads(line) for line in (run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == [1, 2, 3] and all(r["skipped"] == 1.0 for r in logged)
    assert all(r["reward/mean"] == 0.0 for r in logged)
    assert not (run_dir / "stage1" / "final").exists()  # no "done" for a stage that learned nothing
