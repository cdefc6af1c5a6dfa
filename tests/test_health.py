"""Run-health advisories (or1.health): each rule fires once on a synthetic metric stream built to trigger it, at
the step where the stream first crosses its threshold, and not on the same stream kept healthy; the summary lists
what fired and `or1 report` shows it. (That none fires on a healthy tiny run: tests/repro/test_tiny_chain.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.algos.online_filter import PromptStats
from or1.config.schema import HealthConfig, TrainerConfig
from or1.health import Advisor
from or1.trainer.summary import stage_summary

HEALTHY = {
    "batch/sampled": 64.0,
    "batch/rejected_frac": 0.3,
    "response/truncated_frac": 0.02,
    "actor/entropy": 0.4,
    "mismatch/k3_kl": 1e-6,
    "time/reward": 0.5,
    "time/reward_slowest_row": 0.2,
    "perf/tokens_per_s": 2000.0,
}


def stream(steps: int = 30, **drift) -> list[dict]:
    """`steps` healthy records; each `drift` key is a function of the step that replaces that metric."""
    changed = {k.replace("__", "/"): f for k, f in drift.items()}
    return [{"step": s, **HEALTHY, **{k: f(s) for k, f in changed.items()}} for s in range(1, steps + 1)]


def fired(records: list[dict], config: HealthConfig | None = None) -> list:
    return Advisor.replaying(records, config or HealthConfig()).fired


def test_a_healthy_stream_fires_nothing() -> None:
    assert fired(stream(100)) == []


CASES = {
    # rule: (drifting metric, its values by step, the first step where the 5-step mean crosses, by hand)
    # 0.3 then 0.9 from step 20: the mean reaches 0.8 only with five 0.9s (four give 0.78), at step 24
    "zero_advantage": ("batch__rejected_frac", lambda s: 0.3 if s < 20 else 0.9, 24),
    # 0.02 then 0.3 from step 15: four 0.3s give (0.02 + 1.2) / 5 = 0.244 >= 0.2 (three: 0.188), step 18
    "truncation": ("response__truncated_frac", lambda s: 0.02 if s < 15 else 0.3, 18),
    # 0.4 x 0.9^s: the first five average 0.2948; the mean ending at s is 0.4993 x 0.9^s, under a quarter of that
    # (0.0737) from s = 19 (0.9^18 = 0.150, 0.9^19 = 0.135)
    "entropy": ("actor__entropy", lambda s: 0.4 * 0.9**s, 19),
    # one 5e-3 among four 1e-6 already averages 1.0008e-3 > 1e-3: step 10
    "mismatch": ("mismatch__k3_kl", lambda s: 1e-6 if s < 10 else 5e-3, 10),
    # 0.5 then 3.0 s from step 12: k slow steps average 0.5 + 0.5k, which must exceed 2 x 0.5: k = 2, step 13
    "reward_time": ("time__reward", lambda s: 0.5 if s < 12 else 3.0, 13),
    # 2000 then 600 tokens/s from step 16: 2000 - 280k < 1000 needs k = 4, step 19
    "throughput": ("perf__tokens_per_s", lambda s: 2000.0 if s < 16 else 600.0, 19),
}


@pytest.mark.parametrize("rule", CASES)
def test_each_rule_fires_once_where_its_metric_crosses(rule: str) -> None:
    key, values, first_step = CASES[rule]
    records = stream(40, **{key: values})
    advisories = fired(records)
    assert [a.rule for a in advisories] == [rule]  # once, although the metric stays bad
    advisory = advisories[0]
    assert advisory.metric == key.replace("__", "/")
    window = [r[advisory.metric] for r in records if r["step"] <= advisory.step][-5:]
    assert advisory.value == pytest.approx(sum(window) / 5)  # the mean it read, at the step it fired
    assert advisory.step == first_step
    assert advisory.metric in advisory.line() and "health: step" in advisory.line()


def test_entropy_outside_its_band_fires() -> None:
    (low,) = fired(stream(10, actor__entropy=lambda s: 0.005))
    assert low.step == 5 and "collapsed" in low.advice
    (high,) = fired(stream(10, actor__entropy=lambda s: 9.0))
    assert "exploding" in high.advice


def test_thresholds_are_settings_and_can_turn_everything_off() -> None:
    records = stream(40, batch__rejected_frac=lambda s: 0.7)
    assert fired(records) == []
    assert [a.rule for a in fired(records, HealthConfig(zero_advantage_frac=0.6))] == ["zero_advantage"]
    assert fired(records, HealthConfig(enabled=False, zero_advantage_frac=0.6)) == []


def validations(values: list[float]) -> list[dict]:
    return [{"step": 10 * i, "val/math/t1/avg@4": v} for i, v in enumerate(values)]


def test_validation_flat_for_patience_evaluations_fires_once() -> None:
    rising = [0.30, 0.35, 0.40, 0.45, 0.50, 0.55, 0.60]
    assert fired(validations(rising)) == []
    flat = [
        0.30,
        0.40,
        0.45,
        0.452,
        0.449,
        0.455,
        0.45,
        0.44,
    ]  # best 0.45; nothing beats 0.46 in 4 evaluations
    (advisory,) = fired(validations(flat))
    assert advisory.rule == "validation:val/math/t1/avg@4" and advisory.step == 60
    assert advisory.value == pytest.approx(0.455)


def test_the_summary_lists_what_the_stage_fired(tmp_path: Path) -> None:
    records = stream(30, mismatch__k3_kl=lambda s: 0.01)
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = stage_summary(tmp_path, {"stage": 1}, PromptStats(), TrainerConfig())
    assert [a["rule"] for a in summary["advisories"]] == ["mismatch"]
    assert summary["advisories"][0]["step"] == 5


def test_an_infinite_gap_fires_and_missing_values_are_skipped() -> None:
    (advisory,) = fired(stream(10, mismatch__k3_kl=lambda s: float("inf")))  # a broken weight push
    assert advisory.rule == "mismatch" and advisory.value == float("inf") and advisory.step == 5
    assert fired(stream(10, mismatch__k3_kl=lambda s: float("nan"))) == []
