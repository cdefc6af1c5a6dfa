"""The tiny recipe's three stages through the real CLI, back to back: `or1 train --stage 1`, `--stage 2`, `--stage 3`.

Slow (about 20 minutes on 2 cores): from the tiny base shipped with or1 (or1.tinyworld.shipped) and the tiny
dataset, runs the three stages of `stages/tiny.yaml` as three `or1 train` processes in one run directory, and checks
the MAGIC recipe from what they leave behind:
- each stage starts from the previous one's final model: its summary.json says so, its final weights are nearer
  (L2) to the previous stage's final than to the base (and, for stage 3, than to stage 1's final), and its step-0
  validation is nearer to the previous stage's last validation than to the base's;
- the adaptive entropy coefficient moves (`entropy/coef` takes several values), rejection sampling drops groups
  (`batch/rejected_frac` > 0), and the online filter drops prompts before stages 2 and 3 (console report and
  summary.json);
- validation after stage 3 beats the base by >= 5 points, both in training (avg@5 of stage 1's step 0 vs stage 3's
  last step) and measured here on the 200-problem split (5 samples, T=1.0, 96 tokens). The README's whole chain
  measured 39.6% -> 57.2%.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from or1.data.synthetic import write_tiny_dataset
from or1.tinyworld.shipped import SHIPPED_BASE
from or1.tinyworld.solve_rate import validation_solve_rate

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
ENV = {**os.environ, "COLUMNS": "1000"}  # rich wraps console lines at 80 columns off a terminal
VAL_KEY = re.compile(r"^val/[^/]+/t1/avg@5$")


def train(stage: int, run_dir: Path, overrides: list[str]) -> str:
    """One `or1 train --stage N` process; its console output (also kept in run_dir/stage<N>.log)."""
    cmd = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--stage", str(stage)]
    cmd += ["--run-dir", str(run_dir), *(arg for o in overrides for arg in ("--set", o))]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=3000, env=ENV)
    (run_dir / f"stage{stage}.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def records(run_dir: Path, stage: int) -> list[dict]:
    lines = (run_dir / f"stage{stage}" / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def validation(record: dict) -> float:
    (key,) = [k for k in record if VAL_KEY.match(k)]
    return record[key]


def distance(a: Path, b: Path) -> float:
    """L2 distance between two model folders' weights."""
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert wa.keys() == wb.keys()
    return math.sqrt(sum(float((wa[k] - wb[k]).double().pow(2).sum()) for k in wa))


def dropped_prompts(stdout: str) -> list[int]:
    return [int(n) for n in re.findall(r"^online filter: dropped (\d+) prompts", stdout, flags=re.MULTILINE)]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_tiny_stages_back_to_back(tmp_path: Path) -> None:
    base = SHIPPED_BASE
    data = write_tiny_dataset(tmp_path / "tiny" / "data", seed=0)
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    overrides = [
        f"model.path={base}",
        f"data.train_files=[{data.train}]",
        f"data.validation.sets=[{data.validation}]",
    ]
    out = {stage: train(stage, run_dir, overrides) for stage in (1, 2, 3)}
    finals = {0: base, **{stage: run_dir / f"stage{stage}" / "final" for stage in (1, 2, 3)}}
    logs = {stage: records(run_dir, stage) for stage in (1, 2, 3)}
    for stage in (1, 2, 3):
        assert f"stage {stage} done: final model in" in out[stage]
        assert [r["step"] for r in logs[stage]] == list(range(len(logs[stage])))

    # Each stage starts from the previous stage's final model: it says so, and its weights and validation show it.
    summaries = {
        stage: json.loads((run_dir / f"stage{stage}" / "summary.json").read_text()) for stage in (1, 2, 3)
    }
    for stage in (1, 2, 3):
        assert summaries[stage]["start_model"] == str(finals[stage - 1])
    d = {(i, j): distance(finals[i], finals[j]) for i in finals for j in finals if i < j}
    print("weight distances", {f"{i}-{j}": round(v, 4) for (i, j), v in d.items()})
    assert d[1, 2] < d[0, 2]
    assert d[2, 3] < min(d[1, 3], d[0, 3])
    base_val = validation(logs[1][0])
    for stage in (2, 3):
        start, previous_end = validation(logs[stage][0]), validation(logs[stage - 1][-1])
        assert abs(start - previous_end) < abs(start - base_val), (stage, base_val, previous_end, start)

    # MAGIC: adaptive entropy control, rejection sampling, online filtering between stages.
    # Records of steps that trained (neither the step-0 validation nor a skipped step).
    trained = [r for stage in (1, 2, 3) for r in logs[stage] if "entropy/coef" in r]
    coefs = [r["entropy/coef"] for r in trained]
    print(f"entropy/coef {min(coefs):g}..{max(coefs):g} ({len(set(coefs))} values)")
    assert len({r["entropy/coef"] for r in logs[1] if "entropy/coef" in r}) > 1
    rejected = [r["batch/rejected_frac"] for r in trained]
    skipped = sum(r.get("skipped", 0) for stage in (1, 2, 3) for r in logs[stage])
    print(
        f"batch/rejected_frac mean {sum(rejected) / len(rejected):.3f} max {max(rejected):.3f}; {skipped} skipped"
    )
    assert max(rejected) > 0  # groups rejected in steps that still trained
    dropped = {stage: dropped_prompts(out[stage]) for stage in (2, 3)}
    print("online filter dropped", dropped)
    assert len(dropped[2]) == 1 and len(dropped[3]) == 2  # stage 3 filters by stages 1 and 2
    assert sum(dropped[2]) > 0 and sum(dropped[3]) > 0
    for stage in (2, 3):
        assert list(summaries[stage]["online_filter_dropped"].values()) == dropped[stage]

    # Validation after stage 3 beats the base: in training and measured here.
    final_val = validation(logs[3][-1])
    before, after = validation_solve_rate(base).overall, validation_solve_rate(finals[3]).overall
    print(f"in-training avg@5 {base_val:.1%} -> {final_val:.1%}; measured {before:.1%} -> {after:.1%}")
    assert final_val - base_val >= 0.05
    assert after - before >= 0.05
