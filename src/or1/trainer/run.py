"""`or1 train`: one stage of a recipe from its checks to its summary, or every remaining stage in order.

A stage resolves its config, passes the pre-flight checks (`or1.preflight.check_runnable`), applies the resume
rules (`resume`), trains in a Ray session (`session`), restarted from the latest checkpoint when a worker process
dies, and writes its summary and the run's report. Run folder names: `or1.layout`; what a stage hands the next:
`handoff`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rich.console import Console

from or1.config.loading import dump, load_recipe, resolve, stage_names
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.hybrid import WorkerError
from or1.layout import CONFIG_FILE, FINAL_CRITIC_DIR, FINAL_DIR, run_directory, stage_directory
from or1.preflight import check_runnable, check_train
from or1.report import refresh_report
from or1.stop import StopFlag
from or1.trainer.handoff import critic_start
from or1.trainer.loop import Trainer
from or1.trainer.resume import check_config_unchanged, has_results
from or1.trainer.session import train_in_session
from or1.trainer.summary import stage_summary, summary_lines, write_summary


def run_train(
    recipe: str,
    stage: str,
    run_dir: Path | None = None,
    overrides: list[str] | None = None,
    resume: str = "auto",
    ray_address: str | None = None,
    console: Console | None = None,
    *,
    overwrite: bool = False,
    allow_config_change: bool = False,
    stop: StopFlag | None = None,
) -> Path:
    """Train one stage of a recipe; returns the stage's exported final model folder.

    Ctrl-C / SIGTERM (watched from here on) stop it between steps after a checkpoint: `Interrupted` is raised.
    `--resume never` on a stage folder holding results is refused unless `overwrite`; `--resume auto` under a
    config that differs from the stage's config.yaml is refused unless `allow_config_change`.
    """
    console = console or Console(soft_wrap=True)  # paths and counts stay on one line, also in logs
    if resume not in ("auto", "never"):
        raise UserError(f"--resume {resume}: expected auto or never")
    cfg = resolve(recipe, stage, overrides or [])
    run_dir = run_directory(cfg.recipe, run_dir)
    model_path = check_runnable(cfg, run_dir, ray_address)
    check_train(cfg, run_dir, ray_address)
    stage_dir = stage_directory(run_dir, cfg.stage.index)
    # config.yaml records what this stage really starts from (stage N > 1: stage N-1's final)
    cfg.model.path = model_path
    if resume == "never" and stage_dir.exists():
        if has_results(stage_dir) and not overwrite:
            raise UserError(
                f"--resume never: {stage_dir} already holds results of an earlier run (checkpoints, metrics or "
                "a final model); pass --overwrite to delete them and start over, use --resume auto to continue, "
                "or choose another --run-dir"
            )
        shutil.rmtree(stage_dir)  # a fresh start: old checkpoints and metrics would mix with the new run
    elif resume == "auto":
        check_config_unchanged(cfg, stage_dir, allow_config_change, console)
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / CONFIG_FILE).write_text(dump(cfg))
    critic_path = critic_start(cfg, run_dir, model_path) if cfg.uses_critic else None
    console.print(f"stage {cfg.stage.index} of {cfg.recipe} starts from {model_path}", markup=False)
    stop = stop or StopFlag()
    with stop.watching():
        trainer, dropped = _train_with_restarts(
            cfg, stage_dir, model_path, critic_path, resume, ray_address, console, stop
        )
    return _finish_stage(cfg, stage_dir, model_path, critic_path, trainer, dropped, console)


def _train_with_restarts(
    cfg: RunConfig,
    stage_dir: Path,
    model_path: str,
    critic_path: str | None,
    resume: str,
    ray_address: str | None,
    console: Console,
    stop: StopFlag,
) -> tuple[Trainer, dict[str, int]]:
    """train_in_session, restarted from the latest checkpoint when a worker process dies."""
    for attempt in range(cfg.trainer.max_restarts + 1):
        stop.raise_if_requested("stopped before the workers started (no step finished, nothing new to keep)")
        try:
            return train_in_session(
                cfg,
                stage_dir,
                model_path,
                critic_path,
                resume if attempt == 0 else "auto",
                ray_address,
                console,
                stop,
            )
        except WorkerError as err:
            # a process died (a native crash, the OOM killer): the committed checkpoints are intact
            if not err.died or attempt == cfg.trainer.max_restarts:
                raise
            console.print(
                f"{err}; restarting the workers from the latest checkpoint "
                f"(restart {attempt + 1} of at most {cfg.trainer.max_restarts})",
                style="yellow",
                markup=False,
            )
            stop.raise_if_requested("stopped while restarting the workers")
    raise AssertionError("unreachable: the last attempt re-raises")


def _finish_stage(
    cfg: RunConfig,
    stage_dir: Path,
    model_path: str,
    critic_path: str | None,
    trainer: Trainer,
    dropped: dict[str, int],
    console: Console,
) -> Path:
    """Write and print the stage summary; the final model folder."""
    final = stage_dir / FINAL_DIR
    facts = {
        "recipe": cfg.recipe,
        "stage": cfg.stage.index,
        "start_model": model_path,
        "start_critic": critic_path,
        "final_model": str(final),
        "final_critic": str(stage_dir / FINAL_CRITIC_DIR) if critic_path else None,
        "train_prompts": len(trainer.loader),
        "too_long_prompts": trainer.loader.too_long,
        "online_filter_dropped": dropped,
    }
    summary = stage_summary(stage_dir, facts, trainer.prompt_stats)
    write_summary(stage_dir, summary)
    for line in summary_lines(summary):
        console.print(line, highlight=False, markup=False)
    console.print(f"stage {cfg.stage.index} done: final model in {final}", markup=False)
    refresh_report(stage_dir.parent, console)  # plots/ and report.md of the whole run so far
    return final


def run_all_stages(
    recipe: str,
    run_dir: Path | None = None,
    overrides: list[str] | None = None,
    resume: str = "auto",
    ray_address: str | None = None,
    console: Console | None = None,
    *,
    overwrite: bool = False,
    allow_config_change: bool = False,
    stop: StopFlag | None = None,
) -> Path:
    """`--stage all`: run the recipe's stages in order, skipping (with resume auto) those already finished."""
    console = console or Console(soft_wrap=True)  # paths and counts stay on one line, also in logs
    _, raw = load_recipe(recipe)
    final = None
    stop = stop or StopFlag()
    for index in range(1, len(stage_names(raw)) + 1):
        cfg = resolve(recipe, index, overrides or [])
        stage_final = stage_directory(run_directory(cfg.recipe, run_dir), index) / FINAL_DIR
        if resume == "auto" and (stage_final / "config.json").is_file():
            console.print(f"stage {index} already finished: {stage_final}", markup=False)
            final = stage_final
            continue
        with stop.watching():
            stop.raise_if_requested(f"stopped before stage {index}")
            final = run_train(
                recipe,
                str(index),
                run_dir,
                overrides,
                resume,
                ray_address,
                console,
                overwrite=overwrite,
                allow_config_change=allow_config_change,
                stop=stop,
            )
    assert final is not None  # a recipe has at least one stage (load_recipe checks)
    return final
