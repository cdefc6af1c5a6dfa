"""actor.old_log_prob auto (the on-policy update takes its old log-probs from its own forward) against recompute
(the separate pass) through the real `or1 train`: the same steps, losses, entropy control and weights, without the
old-log-prob phase. Slow: two short runs of the tiny recipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from run_files import metrics, tiny_run, weights

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
STEPS = 3


def train(run_dir: Path, model_dir: Path, data_dir: Path, old_log_prob: str, correction: str) -> None:
    sets = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        f"trainer.steps={STEPS}",
        "data.validation.sets=[]",
        "algorithm.rejection_sampling=false",  # every step trains, whatever the test base solves
        # a non-zero coefficient and a target above any estimate: the bonus is in every step's loss, and paper
        # timing's switch reads the sampler's log-probs
        "algorithm.entropy.init_coef=0.002",
        "algorithm.entropy.target=5.0",
        f"actor.old_log_prob={old_log_prob}",
        f"algorithm.rollout_correction.is_level='{correction}'",  # quoted: YAML reads a bare off as false
    )
    cmd = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--run-dir", str(run_dir)]
    done = subprocess.run(
        [*cmd, *(a for s in sets for a in ("--set", s))],
        capture_output=True,
        text=True,
        timeout=900,
        env=os.environ,
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("correction", ["off", "token"])  # token: TIS's weights from the update's own forward
def test_the_fused_pass_trains_like_the_separate_one(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path, correction: str
):
    for mode in ("auto", "recompute"):
        train(tmp_path / mode, tiny_model_dir, tiny_data_dir, mode, correction)
    fused, separate = metrics(tmp_path / "auto"), metrics(tmp_path / "recompute")
    assert [r["step"] for r in fused] == [r["step"] for r in separate] == list(range(1, STEPS + 1))
    for a, b in zip(fused, separate, strict=True):
        assert a.keys() == b.keys()
        assert a["entropy/alpha"] > 0  # the entropy bonus was in the loss
        assert ("mismatch/is_weight_mean" in a) == (correction != "off")
        for key, value in b.items():
            assert a[key] == pytest.approx(value, rel=1e-3, abs=1e-5), (a["step"], key)
    for name, has_pass in (("auto", False), ("recompute", True)):
        lines = (tmp_path / name / "stage1" / "metrics.jsonl").read_text().splitlines()
        assert all(("time/old_log_prob" in json.loads(line)) == has_pass for line in lines)
    final = {name: weights(tmp_path / name / "stage1" / "final") for name in ("auto", "recompute")}
    for name, value in final["recompute"].items():  # Adam moves each weight by about lr (5e-5) per step
        torch.testing.assert_close(final["auto"][name], value, atol=1e-6, rtol=0)
