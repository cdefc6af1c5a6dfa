"""bench/rl_step.py's pure parts (metrics parsing, TRL step records, medians, shares, table), without TRL."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "rl_step.py"


@pytest.fixture(scope="module")
def rl_step():
    spec = importlib.util.spec_from_file_location("rl_step", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_step"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    yield module
    del sys.modules["rl_step"]


def test_or1_metrics_skip_validation_and_keep_the_last_line_of_a_step(rl_step):
    lines = [
        json.dumps({"step": 0, "val/x/t1/avg@5": 0.4}),
        json.dumps({"step": 1, "time/step": 3.0, "time/generate": 1.0, "time/update": 1.5}),
        json.dumps({"step": 2, "time/step": 9.0, "time/generate": 9.0}),  # cut back by a resume ...
        json.dumps({"step": 2, "skipped": 1.0, "time/step": 1.2, "time/generate": 1.0, "time/reward": 0.1}),
        "",
    ]
    steps, phases, skipped = rl_step.parse_or1_metrics(lines)
    assert steps == [3.0, 1.2]  # ... and rewritten: the later line wins
    assert phases == {"generate": [1.0, 1.0], "reward": [0.0, 0.1], "update": [1.5, 0.0]}
    assert skipped == 1


def test_trl_steps_startup_to_the_first_end_and_each_step_begin_to_end(rl_step):
    lines = [
        json.dumps({"step": 1, "begin": 112.0, "end": 115.0}),
        json.dumps({"step": 2, "begin": 115.5, "end": 118.0}),
    ]
    assert rl_step.trl_steps(lines, launched=100.0) == (15.0, [3.0, 2.5])
    with pytest.raises(ValueError, match="no step"):
        rl_step.trl_steps([""], launched=100.0)


def test_median_after_warmup_and_model_share(rl_step):
    assert rl_step.median_after_warmup([9.0, 8.0, 1.0, 3.0, 2.0], warmup=2) == 2.0
    assert rl_step.median_after_warmup([9.0, 7.0], warmup=5) == 8.0  # too short: every step
    run = rl_step.RunResult(
        "or1",
        [5.0, 2.0, 2.0, 2.0],
        30.0,
        phases={
            "generate": [3.0, 1.0, 1.0, 1.0],
            "reward": [0.2, 0.2, 0.2, 0.2],
            "update": [1.8, 0.6, 0.8, 0.6],
            "ref_log_prob": [0.0, 0.0, 0.0, 0.0],
        },
    )
    phases = rl_step.phase_shares(run, warmup=1)
    assert phases == {"generate": 1.0, "reward": 0.2, "update": 0.6}  # a phase that never ran is left out
    assert rl_step.model_share(phases, run.median(1)) == pytest.approx((1.0 + 0.6) / 2.0)


def test_summary_ratio_is_trl_over_or1_of_the_pooled_medians(rl_step):
    or1 = rl_step.RunResult("or1", [9.0, 2.0, 2.0, 3.0], 20.0, phases={"generate": [1.0] * 4})
    trl = rl_step.RunResult("trl", [9.0, 4.0, 5.0, 6.0], 15.0)
    report, ratio = rl_step.summary([or1, trl], warmup=1)
    assert ratio == pytest.approx(5.0 / 2.0)
    assert "| 2 | trl | 4 | 5.00 | 15.0 |" in report
    assert report.splitlines()[0].startswith("| run | framework |")


def test_settings_reach_or1_as_overrides(rl_step):
    overrides = rl_step.Settings(n=16, max_tokens=96).or1_overrides()
    assert "rollout.n=16" in overrides and "rollout.max_response_length=96" in overrides
    assert (
        "actor.ppo_mini_batch_size=16" in overrides
    )  # one optimizer step per batch, as TRL's num_iterations 1
    assert "algorithm.entropy.target=0.09" in overrides  # the entropy control TRL gets


def test_scaling_doubles_n_and_the_budget_and_tables_or1(rl_step, monkeypatch, tmp_path):
    seen = []

    def fake_or1(settings, steps, run_dir, extra=()):
        seen.append((settings.n, settings.max_tokens, steps, tuple(extra)))
        step = settings.n * settings.max_tokens / 384  # 1.0 s at the base point (8 x 48)
        return rl_step.RunResult(
            "or1", [step] * steps, 10.0, {"generate": [step / 2] * steps}, load="1.0 1.0 1.0"
        )

    monkeypatch.setattr(rl_step, "run_or1", fake_or1)
    args = argparse.Namespace(scaling_steps=4, warmup=1)
    out = rl_step.scaling(args, rl_step.Settings(), tmp_path, python=None)
    assert [(n, t) for n, t, _, _ in seen] == [(4, 48), (8, 48), (16, 48), (8, 24), (8, 96)]  # base once
    assert all(steps == 4 and extra == ("data.validation.sets=[]",) for _, _, steps, extra in seen)
    assert "| n | 16 | 2.00 | 50% | 1.0 1.0 1.0 |" in out
    assert "| budget | 24 | 0.50 | 50% | 1.0 1.0 1.0 |" in out
    assert out.count("| 1.00 | 50% |") == 2  # the base point on both lines
