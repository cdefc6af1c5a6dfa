"""Resume checks of one stage: does its folder hold an earlier run's results, and were they made with the settings
of this command (a resume under other settings would mix two runs)."""

from __future__ import annotations

from pathlib import Path

import yaml
from rich.console import Console

from or1.config.recipe import dump
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.layout import CONFIG_FILE, FINAL_CRITIC_DIR, FINAL_DIR, METRICS_FILE, SUMMARY_FILE
from or1.trainer.checkpoint import CheckpointManager

# Settings that change how a run is operated, not what it computes: a resume may change them freely.
OPERATIONAL_KEYS = (
    "trainer.steps",  # training a stage longer (or ending it sooner) leaves the steps already done as they were
    "trainer.until",  # the same: a rule that ends the stage sooner or later changes no step already trained
    "trainer.save_every",
    "trainer.loggers",
    "trainer.keep_checkpoints",
    "trainer.max_restarts",
    "trainer.max_skipped_steps",
    "trainer.samples_per_step",
    "trainer.threads_per_worker",
    "trainer.wandb_project",
    "trainer.wandb_run_name",
    "reward.workers",
    "reward.placement",
    "reward.scorer_cpus",
    "reward.scorer_grace",
    "reward.scoring_retries",
)


def has_results(stage_dir: Path) -> bool:
    """True when a stage folder holds what a run produced: metrics, checkpoints, a final model or a summary."""
    metrics = stage_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        return True
    if CheckpointManager(stage_dir, 1).latest() is not None:
        return True
    return any((stage_dir / name).exists() for name in (FINAL_DIR, FINAL_CRITIC_DIR, SUMMARY_FILE))


def check_config_unchanged(cfg: RunConfig, stage_dir: Path, allowed: bool, console: Console) -> None:
    """Resuming a stage under other settings than its config.yaml mixes two runs: a UserError unless `allowed`."""
    saved_file = stage_dir / CONFIG_FILE
    if not saved_file.is_file() or not has_results(stage_dir):
        return
    changes = config_differences(yaml.safe_load(saved_file.read_text()) or {}, yaml.safe_load(dump(cfg)))
    if not changes:
        return
    listed = "; ".join(changes)
    if not allowed:
        raise UserError(
            f"{stage_dir} was trained with other settings than this command's ({listed}); resume with the "
            "same settings, pass --allow-config-change to continue under the new ones, or --resume never "
            "--overwrite to start the stage over"
        )
    console.print(f"continuing {stage_dir} under changed settings: {listed}", style="yellow", markup=False)


def config_differences(saved: dict, current: dict, prefix: str = "") -> list[str]:
    """`key: old -> new` for each leaf that differs, skipping OPERATIONAL_KEYS; paths compare resolved."""
    out = []
    for key in sorted(set(saved) | set(current)):
        name = f"{prefix}{key}"
        if name in OPERATIONAL_KEYS:
            continue
        old, new = saved.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            out += config_differences(old, new, f"{name}.")
        elif old != new and not (name == "model.path" and _same_path(old, new)):
            out.append(f"{name}: {old} -> {new}")
    return out


def _same_path(a: object, b: object) -> bool:
    return isinstance(a, str) and isinstance(b, str) and Path(a).resolve() == Path(b).resolve()
