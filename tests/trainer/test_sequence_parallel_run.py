"""`or1 train` with Ulysses sequence parallelism: the tiny recipe's 2 ranks as one SP group (actor and critic) take
the same PPO-GAE step as the same 2 ranks data-parallel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rich.console import Console

from or1.layout import FINAL_CRITIC_DIR
from or1.trainer.launch import launch
from or1.trainer.request import TrainRequest
from run_files import metrics, tiny_run, weights

# Adam's first step moves each weight by ~lr * sign(grad): float rounding may flip the sign of a near-zero gradient
LR = 1e-4
RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


def train(run_dir: Path, model: Path, data: Path, sp: int) -> Path:
    overrides = tiny_run(
        model,
        data / "train.parquet",
        "data.validation.sets=[]",
        "algorithm.advantage=gae",
        "algorithm.rejection_sampling=false",
        "trainer.steps=1",
        f"actor.lr={LR}",
        f"critic.lr={LR}",
        f"actor.sequence_parallel_size={sp}",
        f"critic.sequence_parallel_size={sp}",
    )
    return launch(
        TrainRequest(RECIPE, "1", run_dir, tuple(overrides), "never"), Console(file=open("/dev/null", "w"))
    )


@pytest.mark.slow
def test_one_sp_group_steps_like_two_data_parallel_ranks(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    train(tmp_path / "dp", tiny_model_dir, tiny_data_dir, sp=1)
    train(tmp_path / "sp", tiny_model_dir, tiny_data_dir, sp=2)
    (dp,), (sp,) = metrics(tmp_path / "dp"), metrics(tmp_path / "sp")
    assert dp.keys() == sp.keys()
    # the rollout is the same (it is not sequence-parallel, and the weights it samples from are the start's)
    assert sp["response/tokens"] == dp["response/tokens"]
    for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
        assert sp[key] == pytest.approx(dp[key], rel=1e-4, abs=1e-7), key
    for folder in ("final", FINAL_CRITIC_DIR):
        a, b = weights(tmp_path / "dp" / "stage1" / folder), weights(tmp_path / "sp" / "stage1" / folder)
        for name, value in a.items():
            torch.testing.assert_close(b[name], value, atol=0.05 * LR, rtol=0, msg=f"{folder}/{name}")
