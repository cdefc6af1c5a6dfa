"""The stage runner: the stages of one `or1 train` request in order, each from its checks to its summary.

A stage takes its resolved config (`or1.trainer.launch` resolves each once), passes the checks that need the
previous stage's results (`or1.preflight.check_runnable`), applies the resume rules (`resume`), trains in the running
Ray (`session`), restarted from the latest checkpoint when a worker process dies, and writes its summary and the
run's report. Run folder names: `or1.layout`; what a stage starts from: `stage_start`.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from or1.config.recipe import dump
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.health import idle_stop_rules
from or1.hybrid.worker_group import WorkerError
from or1.layout import CONFIG_FILE, FINAL_CRITIC_DIR, FINAL_DIR, finished_model, stage_directory
from or1.preflight import check_runnable
from or1.report import refresh_report
from or1.stop import StopFlag
from or1.trainer.loop import Trainer
from or1.trainer.request import TrainRequest
from or1.trainer.resume import check_config_unchanged, has_results
from or1.trainer.stage_session import train_in_session
from or1.trainer.stage_start import StageStart, critic_start
from or1.trainer.summary import stage_summary, summary_lines, write_summary


@dataclass(frozen=True)
class StageRun:
    """How the stages of one request run: the request's resume rules, where they write, what they report to."""

    request: TrainRequest
    run_dir: Path
    console: Console
    stop: StopFlag


def run_stages(
    request: TrainRequest, stages: list[RunConfig], run_dir: Path, console: Console, stop: StopFlag
) -> Path:
    """Run `stages` in order (with `all` and resume auto, skipping those already finished); the last final model."""
    run = StageRun(request, run_dir, console, stop)
    final = None
    for cfg in stages:
        index = cfg.stage.index
        done = finished_model(run_dir, index)
        if request.stage == "all" and request.resume == "auto" and done is not None:
            console.print(f"stage {index} already finished: {done}", markup=False)
            final = done
            continue
        stop.raise_if_requested(f"stopped before stage {index}")
        final = run_stage(cfg, run)
    assert final is not None  # a recipe has at least one stage (load_recipe checks)
    return final


def run_stage(cfg: RunConfig, run: StageRun) -> Path:
    """Train one stage; returns its exported final model folder.

    `--resume never` on a stage folder holding results is refused unless `overwrite`; `--resume auto` under a
    config that differs from the stage's config.yaml is refused unless `allow_config_change`.
    """
    request, console = run.request, run.console
    model_path = check_runnable(cfg, run.run_dir, request.ray_address)
    stage_dir = stage_directory(run.run_dir, cfg.stage.index)
    # config.yaml records what this stage really starts from (stage N > 1: stage N-1's final)
    cfg.model.path = model_path
    if request.resume == "never" and stage_dir.exists():
        if has_results(stage_dir) and not request.overwrite:
            raise UserError(
                f"--resume never: {stage_dir} already holds results of an earlier run (checkpoints, metrics or "
                "a final model); pass --overwrite to delete them and start over, use --resume auto to continue, "
                "or choose another --run-dir"
            )
        shutil.rmtree(stage_dir)  # a fresh start: old checkpoints and metrics would mix with the new run
    elif request.resume == "auto":
        check_config_unchanged(cfg, stage_dir, request.allow_config_change, console)
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / CONFIG_FILE).write_text(dump(cfg))
    critic_path = critic_start(cfg, run.run_dir, model_path) if cfg.uses_critic else None
    start = StageStart(cfg, stage_dir, model_path, critic_path)
    console.print(f"stage {cfg.stage.index} of {cfg.recipe} starts from {model_path}", markup=False)
    if warning := idle_stop_rules(cfg):
        console.print(f"warning: {warning}", markup=False)
    trainer, dropped = _train_with_restarts(start, request.resume, run)
    return _finish_stage(start, trainer, dropped, console)


def _train_with_restarts(start: StageStart, resume: str, run: StageRun) -> tuple[Trainer, dict[str, int]]:
    """train_in_session, restarted from the latest checkpoint when a worker process dies."""
    max_restarts = start.cfg.trainer.max_restarts
    for attempt in range(max_restarts + 1):
        run.stop.raise_if_requested(
            "stopped before the workers started (no step finished, nothing new to keep)"
        )
        try:
            return train_in_session(start, resume if attempt == 0 else "auto", run.console, run.stop)
        except WorkerError as err:
            # a process died (a native crash, the OOM killer): the committed checkpoints are intact
            if not err.died or attempt == max_restarts:
                raise
            run.console.print(
                f"{err}; restarting the workers from the latest checkpoint "
                f"(restart {attempt + 1} of at most {max_restarts})",
                style="yellow",
                markup=False,
            )
            run.stop.raise_if_requested("stopped while restarting the workers")
    raise AssertionError("unreachable: the last attempt re-raises")


def _finish_stage(start: StageStart, trainer: Trainer, dropped: dict[str, int], console: Console) -> Path:
    """Write and print the stage summary; the final model folder."""
    cfg, stage_dir = start.cfg, start.stage_dir
    final = stage_dir / FINAL_DIR
    facts = {
        "recipe": cfg.recipe,
        "stage": cfg.stage.index,
        "start_model": start.model_path,
        "start_critic": start.critic_path,
        "final_model": str(final),
        "final_critic": str(stage_dir / FINAL_CRITIC_DIR) if start.critic_path else None,
        "train_prompts": len(trainer.loader),
        "too_long_prompts": trainer.loader.too_long,
        "online_filter_dropped": dropped,
        "device_peak": trainer.throughput.facts() if trainer.throughput else None,
    }
    summary = stage_summary(stage_dir, facts, trainer.prompt_stats, cfg.trainer)
    write_summary(stage_dir, summary)
    for line in summary_lines(summary):
        console.print(line, highlight=False, markup=False)
    console.print(f"stage {cfg.stage.index} done: final model in {final}", markup=False)
    refresh_report(stage_dir.parent, console)  # plots/ and report.md of the whole run so far
    return final
