"""The names of a run folder's parts, in one place: the trainer writes them; resume, `or1 report` and eval read them.

```
runs/<recipe>/                      run_directory (or --run-dir)
  stage<N>/                         stage_directory
    config.yaml                     the stage's resolved config
    metrics.jsonl  tensorboard/  samples/
    checkpoints/step_<k>/  latest   (trainer/checkpoint.py writes them)
      model/  critic/  rng_rank<r>.pt   the workers' parts: HF folders + optimizer.pt, each rank's RNG
      controller.pt                 the controller's parts, written last: the checkpoint is complete with it
    prompt_stats.parquet            per-prompt solve counts: the next stage's online filter
    final/  final_critic/           the stage's exported models (final_critic under GAE)
    summary.json
  eval/<name>/                      summary.json, report.md, samples.jsonl (or1 eval)
  plots/  report.md                 (or1 report)
```
"""

from __future__ import annotations

import re
from pathlib import Path

RUNS_DIR = "runs"
STAGE_DIR = re.compile(r"stage(\d+)")
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"
SAMPLES_DIR = "samples"
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_STEP = re.compile(r"^step_(\d+)$")  # a complete checkpoint's folder; step_<k>.tmp while written
CHECKPOINT_MODEL_DIR = "model"  # the actor's HF folder (+ optimizer.pt)
CHECKPOINT_CRITIC_DIR = "critic"  # the critic's (GAE only)
CONTROLLER_FILE = "controller.pt"
LATEST_FILE = "latest"
PROMPT_STATS_FILE = "prompt_stats.parquet"
FINAL_DIR = "final"
FINAL_CRITIC_DIR = "final_critic"
SUMMARY_FILE = "summary.json"  # a stage's summary, and an evaluation's
EVAL_DIR = "eval"
REPORT_FILE = "report.md"  # the run's report (or1 report), and an evaluation's
PLOTS_DIR = "plots"


def run_directory(recipe: str, run_dir: Path | str | None) -> Path:
    """The run directory: the one given, else runs/<recipe name>."""
    return Path(run_dir) if run_dir is not None else Path(RUNS_DIR) / recipe


def stage_directory(run_dir: Path, index: int) -> Path:
    return run_dir / f"stage{index}"


def finished_model(run_dir: Path, index: int) -> Path | None:
    """Stage `index`'s final model when the stage exported it (its config.json is written), else None."""
    folder = stage_directory(run_dir, index) / FINAL_DIR
    return folder if (folder / "config.json").is_file() else None


def finished_critic(run_dir: Path, index: int) -> Path | None:
    """Stage `index`'s final critic (GAE) when the stage exported it, else None."""
    folder = stage_directory(run_dir, index) / FINAL_CRITIC_DIR
    return folder if (folder / "config.json").is_file() else None


def checkpoint_directory(stage_dir: Path, step: int) -> Path:
    """A stage's checkpoint of step `step` (CHECKPOINT_STEP)."""
    return stage_dir / CHECKPOINTS_DIR / f"step_{step}"


def rank_rng_file(rank: int) -> str:
    """A rank's RNG state inside a checkpoint folder."""
    return f"rng_rank{rank}.pt"


# the weights after an older step that the rollout replicas of the separate placement still sample with
ROLLOUT_WEIGHTS_FILE = re.compile(r"^rollout_weights_step_(\d+)\.safetensors$")


def rollout_weights_file(version: int) -> str:
    """The weights after step `version` inside a checkpoint folder (rollout.placement separate)."""
    return f"rollout_weights_step_{version}.safetensors"


ROLLOUT_SHARD_FILE = re.compile(r"^rollout_shard_step_(\d+)\.rank(\d+)-of-(\d+)\.safetensors$")


def rollout_shard_file(version: int, rank: int, ranks: int) -> str:
    """Training rank `rank`'s shard (of `ranks`) of the weights after step `version` inside a checkpoint folder
    (rollout.weight_transfer collective)."""
    return f"rollout_shard_step_{version}.rank{rank}-of-{ranks}.safetensors"
