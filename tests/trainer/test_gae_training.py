"""PPO with GAE through `or1 train`: the critic trains beside the actor, resumes from checkpoints exactly, and the
next stage starts from the previous stage's final critic."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from rich.console import Console
from safetensors.torch import load_file

from or1.layout import FINAL_CRITIC_DIR, SUMMARY_FILE
from or1.trainer.launch import launch
from or1.trainer.request import TrainRequest
from run_files import tiny_run

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


def train(run_dir: Path, model: Path, data: Path, stage: str, steps: int, resume: str = "never") -> Path:
    overrides = tiny_run(
        model,
        data / "train.parquet",
        "data.validation.sets=[]",
        "algorithm.advantage=gae",
        "algorithm.lam=0.95",
        # the critic is the baseline: every step trains, also when the weak test base solves nothing in a group
        "algorithm.rejection_sampling=false",
        f"trainer.steps={steps}",
        "trainer.save_every=1",
    )
    quiet = Console(file=open("/dev/null", "w"))
    return launch(TrainRequest(RECIPE, stage, run_dir, tuple(overrides), resume), quiet)


def records(stage_dir: Path) -> list[dict]:
    lines = (stage_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "perf/"))} for x in lines]


def weights(folder: Path) -> dict:
    return load_file(folder / "model.safetensors")


def test_gae_trains_a_critic_resumes_it_and_hands_it_to_the_next_stage(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(straight, tiny_model_dir, tiny_data_dir, "1", 3)
    steps = records(straight / "stage1")
    assert [r["step"] for r in steps] == [1, 2, 3]
    trained = [r for r in steps if not r.get("skipped")]
    assert trained and all(r["critic/vf_loss"] > 0 and r["critic/grad_norm"] > 0 for r in trained)
    critic = weights(straight / "stage1" / FINAL_CRITIC_DIR)
    assert "score.weight" in critic and "lm_head.weight" not in critic

    train(split, tiny_model_dir, tiny_data_dir, "1", 2)  # stops after step 2, then a second process goes on
    train(split, tiny_model_dir, tiny_data_dir, "1", 3, resume="auto")
    assert records(split / "stage1") == steps
    resumed = weights(split / "stage1" / FINAL_CRITIC_DIR)
    for name, value in critic.items():
        assert (resumed[name] == value).all(), name

    train(straight, tiny_model_dir, tiny_data_dir, "2", 1)
    summary = json.loads((straight / "stage2" / SUMMARY_FILE).read_text())
    assert summary["start_critic"] == str(straight / "stage1" / FINAL_CRITIC_DIR)
    assert summary["start_model"] == str(straight / "stage1" / "final")
    assert summary["final_critic"] == str(straight / "stage2" / FINAL_CRITIC_DIR)
    recorded = yaml.safe_load((straight / "stage2" / "config.yaml").read_text())
    assert recorded["model"]["path"] == summary["start_model"]  # the stage's config names what it loaded
