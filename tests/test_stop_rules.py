"""A stage's stop rules (trainer.until, or1.health): each fires on a synthetic metrics stream at the step computed
by hand and not on the same stream kept healthy; a resume inside a rule's window (the logged records replayed, the
rest observed live) decides the same step; the summary and `or1 report` name the rule. Through a real run with a
kill and a resume: tests/trainer/test_resume_after_kill.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.algos.online_filter import PromptStats
from or1.config.recipe import resolve
from or1.config.schema import PlateauStop, StopRules, TargetStop, TrainerConfig, TruncationStop
from or1.errors import UserError
from or1.health import Advisor, idle_stop_rules
from or1.report.markdown import health_lines
from or1.report.runfiles import read_run
from or1.trainer.summary import stage_summary, summary_lines, write_summary
from test_health import stream

MATH, CODE = "val/math/t1/avg@4", "val/code/t1/avg@2"


def with_validation(
    records: list[dict], every: int, math: list[float], code: list[float] | None = None
) -> list:
    """Step 0's validation, then `records` with an evaluation every `every` steps (math[i], code[i] at the i-th)."""
    code = code or [0.1] * len(math)
    out = [{"step": 0, MATH: math[0], CODE: code[0]}]
    for record in records:
        i = record["step"] // every
        due = record["step"] % every == 0 and i < len(math)
        out.append({**record, MATH: math[i], CODE: code[i]} if due else record)
    return out


def ended(records: list[dict], until: StopRules):
    return Advisor.replaying(records, TrainerConfig().health, until).ended


TRUNCATED = StopRules(truncated=TruncationStop(at_least=0.3, window=4))
PLATEAU = StopRules(plateau=PlateauStop(evaluations=3, min_gain=0.01, set="math"))
SCORE = StopRules(target=TargetStop(score=0.5, set="math"))
GAIN = StopRules(target=TargetStop(gain=0.1))  # the mean of both sets


def test_truncation_ends_the_stage_where_the_window_mean_crosses() -> None:
    assert ended(stream(60), TRUNCATED) is None  # 2% truncated throughout
    # 0.02 then 0.5 from step 15: k of the last 4 at 0.5 average (0.08 + 0.48 k) / 4 >= 0.3 from k = 3: step 17
    end = ended(stream(60, response__truncated_frac=lambda s: 0.02 if s < 15 else 0.5), TRUNCATED)
    assert (end.rule, end.step, end.metric) == ("truncated", 17, "response/truncated_frac")
    assert end.value == pytest.approx((0.02 + 3 * 0.5) / 4)
    assert "last 4 steps" in end.detail and "until.truncated: step 17" in end.line()
    # A stage that starts truncated (an 8K stage starts near 40%) ends only once the share came down and climbs back:
    # 0.4 to step 10, 0.1 to step 30, then 0.5: (0.4 + 0.4 k) / 4 >= 0.3 from k = 2, step 32
    assert ended(stream(60, response__truncated_frac=lambda s: 0.4), TRUNCATED) is None
    back = ended(
        stream(60, response__truncated_frac=lambda s: 0.4 if s <= 10 else 0.1 if s <= 30 else 0.5), TRUNCATED
    )
    assert back.step == 32 and back.value == pytest.approx(0.3)


def test_a_plateau_ends_the_stage_after_its_evaluations_without_a_new_best() -> None:
    rising = [0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60]
    assert ended(with_validation(stream(60), 10, rising), PLATEAU) is None
    # best 0.45 at step 20; 0.452, 0.449, 0.455 (steps 30-50) do not beat 0.46; at step 40 the best before the last
    # three (0.40) was beaten: step 50
    flat = [0.30, 0.40, 0.45, 0.452, 0.449, 0.455, 0.44]
    end = ended(with_validation(stream(60), 10, flat), PLATEAU)
    assert (end.rule, end.step, end.metric, end.value) == ("plateau", 50, "val/math", 0.455)
    assert "earlier best 0.45 " in end.detail
    # the code set rising does not hide the math set's plateau; the mean of both would not have fired
    code = [0.1 * i for i in range(7)]
    assert ended(with_validation(stream(60), 10, flat, code), PLATEAU).step == 50
    assert ended(with_validation(stream(60), 10, flat, code), StopRules(plateau=PlateauStop())) is None


def test_a_target_ends_the_stage_at_the_first_evaluation_that_reaches_it() -> None:
    math = [0.40, 0.44, 0.47, 0.51, 0.49, 0.55]
    assert ended(with_validation(stream(60), 10, [0.40, 0.44, 0.47, 0.49]), SCORE) is None
    end = ended(with_validation(stream(60), 10, math), SCORE)
    assert (end.rule, end.step, end.metric, end.value) == ("target", 30, "val/math", 0.51)
    # gain over the start, on the mean of both sets: (0.40 + 0.10) / 2 = 0.25 at the start; (0.51 + 0.20) / 2 =
    # 0.355 at step 30 is +0.105 (step 20: (0.47 + 0.15) / 2 = 0.31, +0.06)
    code = [0.10, 0.12, 0.15, 0.20, 0.22, 0.25]
    end = ended(with_validation(stream(60), 10, math, code), GAIN)
    assert (end.step, end.metric) == (30, "val/mean") and end.value == pytest.approx(0.355)
    assert end.detail == "+0.105 over the start's 0.25"
    # the start already above the score is not a score the stage reached: the next evaluation decides
    assert ended(with_validation(stream(60), 10, [0.6, 0.4, 0.52]), SCORE).step == 20


@pytest.mark.parametrize(
    ("until", "records", "end_step"),
    [
        (TRUNCATED, stream(60, response__truncated_frac=lambda s: 0.02 if s < 15 else 0.5), 17),
        (PLATEAU, with_validation(stream(60), 10, [0.30, 0.40, 0.45, 0.452, 0.449, 0.455, 0.44]), 50),
        (SCORE, with_validation(stream(60), 10, [0.40, 0.44, 0.47, 0.51]), 30),
    ],
    ids=["truncated", "plateau", "target"],
)
def test_a_resume_inside_the_window_decides_the_same_step(until, records, end_step) -> None:
    for resumed_at in range(end_step - 4, end_step):
        logged = [
            r for r in records if r["step"] <= resumed_at
        ]  # the steps up to the checkpoint resumed from
        advisor = Advisor.replaying(logged, TrainerConfig().health, until)
        assert advisor.ended is None
        for record in records[len(logged) :]:  # as the trainer observes a step: its metrics, then validation
            metrics = {k: v for k, v in record.items() if not k.startswith("val/") and k != "step"}
            advisor.observe_step(record["step"], metrics)
            advisor.observe_validation(
                record["step"], {k: v for k, v in record.items() if k.startswith("val/")}
            )
            if advisor.ended is not None:
                break
        assert advisor.ended == ended(records, until) and advisor.ended.step == end_step


def test_health_off_still_ends_the_stage() -> None:
    config = TrainerConfig().health.model_copy(update={"enabled": False})
    records = stream(60, response__truncated_frac=lambda s: 0.02 if s < 5 else 0.5)
    assert Advisor.replaying(records, config, TRUNCATED).ended.step == 7


def test_the_summary_and_the_report_name_the_rule(tmp_path: Path) -> None:
    stage = tmp_path / "stage1"
    stage.mkdir()
    records = stream(17, response__truncated_frac=lambda s: 0.02 if s < 15 else 0.5)
    (stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (stage / "config.yaml").write_text("stage: {index: 1, name: '1'}\ntrainer: {steps: 40}\n")
    summary = stage_summary(stage, {"stage": 1}, PromptStats(), TrainerConfig(until=TRUNCATED))
    assert summary["ended_by"]["rule"] == "truncated" and summary["ended_by"]["step"] == 17
    assert any(line.startswith("  ended by truncated at step 17") for line in summary_lines(summary))
    write_summary(stage, summary)
    assert "ended at step 17 by its stop rule until.truncated" in "\n".join(health_lines(read_run(tmp_path)))
    assert stage_summary(stage, {"stage": 1}, PromptStats(), TrainerConfig())["ended_by"] is None


def test_a_stage_without_validation_runs_its_steps_and_says_why_and_without_jsonl_is_refused() -> None:
    assert idle_stop_rules(resolve("tiny", 1)) is None  # validated every 20 steps
    for off in ("data.validation.sets=[]", "data.validation.every=0"):
        warning = idle_stop_rules(resolve("tiny", 1, [off]))
        assert (
            warning.startswith("trainer.until.target read validation") and "runs its trainer.steps" in warning
        )
    assert idle_stop_rules(resolve("tiny", 2, ["data.validation.sets=[]"])) is None  # stage 2 has no rule
    with pytest.raises(UserError, match="keep jsonl in trainer.loggers"):
        resolve("tiny", 1, ["trainer.loggers=[tensorboard]"])
    assert (
        resolve("tiny", 1, ["trainer.loggers=[tensorboard]", "trainer.until={}"]).trainer.until == StopRules()
    )
