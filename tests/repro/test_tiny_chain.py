"""The tiny reproduction in CI: a shortened copy of stages/tiny.yaml through `or1 train --stage all`, checked.

Default suite (not slow). It runs the shipped recipe's three stages (budgets 48 / 64 / 96 tokens, GRPO, rejection
sampling, adaptive entropy control, online filtering, arithmetic and programs in the same batches) for fewer steps
(STEPS) from the tiny base shipped with or1 (or1.tinyworld.shipped), in one `or1 train --stage all` process, and fails when
- validation (every stage at the same 96-token budget, the same seeds at every validation) does not rise by
  STAGE1_MARGIN from the base to the end of stage 1 and by TOTAL_MARGIN over the whole chain, code validation by
  CODE_MARGIN over the chain, or the mean of both from the end of stage 1 to the end of stage 3 by CHAIN_MARGIN;
- a stage starts wrong: it does not start from the previous stage's final model (its summary says so, and its
  step-0 validation equals the previous stage's last one: same weights, same seeds), stage 1 solves no prompt at
  every attempt (TRAIN_OPS makes some certain), the online filter's counts differ from the always-solved prompts in
  the earlier stages' prompt statistics, or a stage's entropy controller does not start afresh from init_coef at its
  own target, or the coefficient never moves;
- a run-health advisory (or1.health) on what the run learns fires on this healthy run (the rules on wall-clock
  seconds read the machine's other work, not the run: left out);
- a figure of `or1 report` is missing.

The margins hold on any trajectory, not one machine's: torch picks other CPU kernels on other processors (AVX2,
AVX-512), so the RL steps end in another model there. The base does not: it is shipped, the same bits everywhere
(built on each machine, an Intel Xeon's base read 24.0% here and its stage 1 gained +3.8). Stage 1 ends by its stop
rule (stages/tiny.yaml: arithmetic validation 6 points over the base, read every 20 steps), so the check on stage 1
holds by construction once the rule fires, and the test fails when it does not fire before step 100. Measured with
`python tests/repro/spread.py` on an AVX2 AMD EPYC and an Intel Xeon (AVX-512, AMX), torch's own kernels unless
named, arithmetic avg@16 and programs avg@8, in %:

    CPU, kernel        seed  stage 1 ends  arithmetic: base  stage 1  stage 2  stage 3   programs: base  s1    s2    s3
    AMD AVX2, own      0     step 60                   50.6  59.0     61.6     63.8                14.6  17.4  26.3  30.0
    AMD AVX2, own      1     step 40                   50.7  57.3     60.0     62.9                15.9  18.1  23.0  26.5
    AMD AVX2, own      2     step 40                   51.2  58.0     60.0     60.4                14.6  17.1  25.5  27.9
    AMD AVX2, default  0     step 60                   50.6  59.0     61.6     63.6                14.6  17.4  26.2  29.4
    Intel AVX-512, own 0     step 60                   50.6  59.0     61.6     63.9                14.6  17.4  26.2  29.4
    Intel AVX-512, own 1     step 40                   50.7  57.3     60.0     62.0                15.9  18.1  22.6  26.1
    Intel AVX-512, own 2     step 40                   51.2  58.0     60.0     60.4                14.6  17.1  25.5  27.9

Before the stop rule (stage 1 at its 100 steps), eight runs over two AMD EPYC machines (with AVX-512: torch's own
kernels with seeds 0-2, ATEN_CPU_CAPABILITY=avx2 and =default with seed 0; AVX2 only: its own kernels with seeds 0-1,
=default with seed 0) gained, mean (lowest), arithmetic +10.7 (+9.0) in stage 1 and +13.9 (+12.8) over the chain,
programs +16.4 (+14.2) over the chain, stages 2-3 +6.5 (+4.55). The kernels part the runs only late (the seed-0 runs
read the same through stage 2 on both machines; their gradients differ in the last digits), the seeds from the
start: over the seeds the standard deviations were 0.8-1.6 points. The shorter stage 1 leaves the chain less: the
margins, +5, +6.5 (it was +8 before the rule), +8 and +2 points, sit 1.6-4.4 points under the lowest run (the
Intel Xeon's seed 1: +6.6, +11.3, +10.2, +6.4). The Intel Xeon ends stage 1 at the AMD EPYC's steps and reads what
it reads through stage 1 on every seed (seed 2 through stage 3). A stage
that does not learn reads exactly the validation it started from (the same weights and seeds), so each check fails then: with actor.lr=1e-12 stage 1
reads +0.0 and the test fails; with algorithm.online_filter=false the stage-start check fails. With the code rewards of
training zeroed (OR1_REPRO_ZERO_CODE=1, seed 0) programs read 14.6% -> 15.4% (+0.8) while arithmetic still rose
50.6% -> 64.2%, and the test failed: "the chain learned too little code". The stage 1 prompts at every attempt
solved: 173-187, then 151-162 more in stage 2 (TRAIN_OPS).

On the base of an earlier warm start (40% programs, torch's own kernels: math 38%, programs 14% on AVX-512, 55%
and 7% under avx2), the same chain gained +3.6 to +8.0 points in stage 1 and +7.0 to +9.6 over the chain on
arithmetic alone, and programs +11.9 to +15.9 (AVX-512) but +9.3 under avx2; the margins were +1.5, +5, +5 and > 0.

Set OR1_REPRO_SET (space-separated key=value) to add --set overrides, e.g. OR1_REPRO_SET=actor.lr=1e-12 to see it
fail when learning is broken, OR1_REPRO_SEED for another trainer seed, and OR1_REPRO_ZERO_CODE=1 to zero the code
rewards of training (the program prompts' expected outputs are replaced by one no program prints; code validation
keeps its true tests) and see the code check fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from or1.data.synthetic import SPLITS, TinyDataset, write_tiny_dataset
from or1.tinyworld.shipped import SHIPPED_BASE

RECIPE = Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml"
STEPS = (100, 60, 60)  # the shipped recipe: 150 / 80 / 60
# The base: the one shipped with or1, at the frontier (51.9% of arithmetic, 15.0% of programs). The session's
# 120-step model solves a few percent, too few groups with a reward signal to learn from in a few dozen steps.
BASE = SHIPPED_BASE
# 16 samples per problem: with the recipe's 5 (or 4), one validation of the 200 problems is worth about +-1.8 points,
# as much as a few dozen steps move it, and a check on a rise would pass or fail by the dice.
VALIDATION_N = 16
# Sized from the module docstring's tables (validation avg@16): under the lowest gain measured
# over CPU kernels and seeds.
STAGE1_MARGIN = 0.05
CHAIN_MARGIN = 0.02  # stages 2-3: the mean of both abilities' gains
TOTAL_MARGIN = 0.065  # 0.08 while stage 1 ran its 100 steps (the docstring)
VAL = f"val/validation/t1/avg@{VALIDATION_N}"
# Code validation: the fixed 100 programs, 8 samples each (one validation worth about +-2 points).
CODE_VALIDATION_N = 8
CODE_VAL = f"val/code_validation/t1/avg@{CODE_VALIDATION_N}"
CODE_MARGIN = 0.08  # the chain's code gain, base -> end of stage 3
# Code train prompts beside the math ones (ungraded, 3..6 steps): about a third of each batch, as in the recipe.
CODE_TRAIN_PROMPTS = 400
# The train prompts: 800 over 2..6 operands, so that stage 1 (1,600 prompts) samples each one twice (16 attempts;
# the shipped recipe's 150 steps sample its ~2,000 graded prompts about twice too), and 160 of them have 2 operands, which the base solves
# 86% of the time. Some prompts are then certain to be solved at every attempt, for the online filter to drop: with
# 400 prompts over 3..6 operands (32 attempts each) one CPU kind left none, and 400 over 2..6 left 5 on this one.
TRAIN_PROMPTS = 800
TRAIN_OPS = (2, 3, 4, 5, 6)
SEED = int(os.environ.get("OR1_REPRO_SEED", "0"))  # trainer.seed: the sampling and the data order
WALL_CLOCK_RULES = ("throughput", "reward_time")  # or1.health's rules on seconds and rates
FIGURES = ("validation", "reward", "response_length", "truncation", "entropy", "rejection", "step_time")
ENV = {**os.environ, "COLUMNS": "1000"}  # rich wraps console lines at 80 columns off a terminal


def chain_data(folder: Path) -> TinyDataset:
    """The tiny dataset with TRAIN_PROMPTS math train rows over TRAIN_OPS (written once per folder)."""
    if (folder / "train.parquet").is_file():
        return TinyDataset(*(folder / f"{name}.parquet" for name in SPLITS))
    sizes = {"math_train_size": TRAIN_PROMPTS, "code_train_size": CODE_TRAIN_PROMPTS}
    data = write_tiny_dataset(folder, seed=0, train_ops=TRAIN_OPS, **sizes)
    if os.environ.get("OR1_REPRO_ZERO_CODE") == "1":
        rows = pd.read_parquet(data.code_train)
        rows["reward_model"] = [unreachable(r) for r in rows["reward_model"]]
        rows.to_parquet(data.code_train)
    return data


def unreachable(reward_model: dict | str) -> dict | str:
    """The code reward of a train row with every expected output replaced by one no program of the world prints."""
    loaded = json.loads(reward_model) if isinstance(reward_model, str) else dict(reward_model)
    truth = loaded["ground_truth"]
    truth = json.loads(truth) if isinstance(truth, str) else dict(truth)
    truth["outputs"] = ["no program prints this\n"] * len(truth["outputs"])
    loaded["ground_truth"] = json.dumps(truth) if isinstance(loaded["ground_truth"], str) else truth
    return json.dumps(loaded) if isinstance(reward_model, str) else loaded


def shortened_recipe(folder: Path, model: Path, data: TinyDataset) -> Path:
    """stages/tiny.yaml with fewer steps, avg@16 (math) and avg@8 (code) validation, this test's model and data."""
    recipe = yaml.safe_load(RECIPE.read_text())
    recipe["name"] = "tiny-ci"
    recipe["model"]["path"] = str(model)
    recipe["data"]["train_files"] = [str(data.train), str(data.code_train)]
    code_set = {"set": str(data.code_validation), "n": CODE_VALIDATION_N}
    recipe["data"]["validation"].update(sets=[str(data.validation), code_set], n=VALIDATION_N)
    recipe["trainer"]["save_every"] = 1000  # the stage's end only: checkpoint writes are not what this tests
    for stage, steps in zip(recipe["stages"], STEPS, strict=True):
        stage["steps"] = steps
    path = folder / "tiny-ci.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def records(run: Path, stage: int) -> list[dict]:
    return [json.loads(line) for line in (run / f"stage{stage}" / "metrics.jsonl").read_text().splitlines()]


def always_solved(run: Path, stage: int) -> set[str]:
    stats = pd.read_parquet(run / f"stage{stage}" / "prompt_stats.parquet")
    return set(stats.loc[(stats["attempts"] > 0) & (stats["solved"] == stats["attempts"]), "uid"])


def train_chain(
    folder: Path, base: Path, data: TinyDataset, overrides: list[str], env: dict | None = None
) -> Path:
    """`or1 train --stage all` of the shortened recipe in its own process; the run directory."""
    recipe, run = shortened_recipe(folder, base, data), folder / "run"
    cmd = [sys.executable, "-m", "or1.cli", "train", "--recipe", str(recipe), "--stage", "all"]
    cmd += ["--run-dir", str(run), *(arg for item in overrides for arg in ("--set", item))]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env or ENV)
    (folder / "train.log").write_text(done.stdout + done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


@pytest.mark.timeout(1800)
def test_tiny_chain_learns_and_hands_off(tmp_path: Path) -> None:
    overrides = [f"trainer.seed={SEED}", *os.environ.get("OR1_REPRO_SET", "").split()]
    run = train_chain(tmp_path, BASE, chain_data(tmp_path / "data"), overrides)
    check_chain(run)


def load_run(run: Path) -> tuple[dict[int, list[dict]], dict[int, dict], dict[int, set[str]]]:
    """Each stage's metrics records and summary, and the prompts stages 1 and 2 solved at every attempt."""
    logs = {stage: records(run, stage) for stage in (1, 2, 3)}
    summaries = {s: json.loads((run / f"stage{s}" / "summary.json").read_text()) for s in (1, 2, 3)}
    return logs, summaries, {stage: always_solved(run, stage) for stage in (1, 2)}


def readings(logs: dict[int, list[dict]], summaries: dict[int, dict], solved: dict[int, set[str]]) -> dict:
    """What check_chain asserts on: the validations at each stage's end and the online filter's counts."""
    return {
        "base": logs[1][0][VAL],
        **{f"stage{stage}": logs[stage][-1][VAL] for stage in (1, 2, 3)},
        "code_base": logs[1][0][CODE_VAL],
        **{f"code_stage{stage}": logs[stage][-1][CODE_VAL] for stage in (1, 2, 3)},
        "stage1_end": (summaries[1]["ended_by"] or {}).get("step"),
        "always_solved": [len(solved[1]), len(solved[2] - solved[1])],
        "filter_dropped": [summaries[s]["online_filter_dropped"] for s in (2, 3)],
    }


def chain_readings(run: Path) -> dict:
    """The readings of a finished run directory, whether or not its checks pass."""
    return readings(*load_run(run))


def check_chain(run: Path) -> dict:
    """Every check of the module docstring on a finished run directory; its readings."""
    logs, summaries, solved = load_run(run)
    read = readings(logs, summaries, solved)

    # Learning: base -> end of stage 1 -> end of stage 3, all validated at 96 tokens with the same seeds.
    base, stage1, stage3 = read["base"], read["stage1"], read["stage3"]
    print(f"validation avg@{VALIDATION_N}: base {base:.1%} -> stage 1 {stage1:.1%} -> stage 3 {stage3:.1%}")
    assert stage1 - base >= STAGE1_MARGIN, f"stage 1 learned too little: {base:.1%} -> {stage1:.1%}"
    assert stage3 - base >= TOTAL_MARGIN, f"the chain learned too little: {base:.1%} -> {stage3:.1%}"
    code_base, code_stage1, code_stage3 = read["code_base"], read["code_stage1"], read["code_stage3"]
    print(f"code validation avg@{CODE_VALIDATION_N}: base {code_base:.1%} -> stage 3 {code_stage3:.1%}")
    later = ((stage3 - stage1) + (code_stage3 - code_stage1)) / 2  # stages 2-3, both abilities' mean gain
    assert later >= CHAIN_MARGIN, (
        f"stages 2-3 learned too little: arithmetic {stage1:.1%} -> {stage3:.1%}, "
        f"programs {code_stage1:.1%} -> {code_stage3:.1%}"
    )
    assert code_stage3 - code_base >= CODE_MARGIN, (
        f"the chain learned too little code: {code_base:.1%} -> {code_stage3:.1%}"
    )

    # Stage 1's stop rule (stages/tiny.yaml: arithmetic validation 6 points over the base, every 20 steps) ends it
    # before its steps; stages 2 and 3 have none and run theirs.
    ended = summaries[1]["ended_by"]
    assert ended is not None and ended["rule"] == "target", "stage 1's stop rule did not fire"
    assert ended["step"] < STEPS[0] and summaries[1]["steps"] == ended["step"] == logs[1][-1]["step"]
    assert [summaries[s]["ended_by"] for s in (2, 3)] == [None, None]

    # Start models: each stage starts from the previous one's final weights (the same validation, to the sample).
    for stage in (2, 3):
        assert summaries[stage]["start_model"] == str(run / f"stage{stage - 1}" / "final")
        for key in (VAL, CODE_VAL):
            assert logs[stage][0][key] == logs[stage - 1][-1][key], f"stage {stage} starts from other weights"

    # Online filter: it drops exactly the prompts every earlier stage always solved, and trains on the rest. The
    # 2-operand prompts make sure there are some (TRAIN_OPS).
    total = summaries[1]["train_prompts"]
    assert solved[1], "stage 1 solved no prompt at every attempt: the online filter check has nothing to see"
    assert summaries[2]["online_filter_dropped"] == {"stage1": len(solved[1])}
    assert summaries[3]["online_filter_dropped"] == {
        "stage1": len(solved[1]),
        "stage2": len(solved[2] - solved[1]),
    }
    assert summaries[3]["train_prompts"] == total - len(solved[1] | solved[2])

    # Entropy control: every stage's controller starts at init_coef (0) and moves by delta from its first step, at
    # the stage's own target; the coefficient rose once the policy sharpened below the target. The base's first batch
    # samples at 0.07-0.10 nats per token and sharpens below the target 0.065 within each stage (in the measured
    # chains the coefficient first rose at step 6-81 of stage 1, 4-51 of stages 2-3), so the chain must show a rise.
    entropy = yaml.safe_load(RECIPE.read_text())["algorithm"]["entropy"]
    for stage in (1, 2, 3):
        first = next(r for r in logs[stage] if "entropy/coef" in r)
        assert first["entropy/target"] == entropy["target"]
        assert first["entropy/coef"] in (0.0, pytest.approx(entropy["delta"]))
    rose = max(r.get("entropy/coef", 0.0) for stage in (1, 2, 3) for r in logs[stage])
    assert rose > 0.0, "the entropy coefficient never rose: the controller did not act"

    # Run health: a healthy chain fires no advisory on what it learns under or1.health's default thresholds. The
    # rules on wall-clock seconds read the machine, not the run (with another job beside it, one run otherwise the
    # same as a passing one fired "throughput" at stage 1's step 34), so they are left out here.
    for stage in (1, 2, 3):
        fired = [a for a in summaries[stage]["advisories"] if a["rule"] not in WALL_CLOCK_RULES]
        assert fired == [], f"stage {stage}: {fired}"

    # The report, written by the chain's last stage: every figure of a finished GRPO run.
    for name in (*FIGURES, "online_filter", "overview"):
        assert (run / "plots" / f"{name}.png").is_file(), f"figure {name} missing"
    assert "## Figures" in (run / "report.md").read_text()
    return read
