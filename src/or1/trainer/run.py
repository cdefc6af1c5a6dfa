"""`or1 train`: resolve a stage, check it can run here, start the worker groups, resume, train, export.

Run directory layout (README, "The tiny reproduction"): <run_dir>/stage<N>/{config.yaml, metrics.jsonl, tensorboard/, checkpoints/,
prompt_stats.parquet, final/, summary.json} (+ final_critic/ under GAE). Stage N > 1 starts from
<run_dir>/stage<N-1>/final (and its final_critic) and drops the prompts that earlier stages always solved
(algorithm.online_filter).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.algos.online_filter import PromptStats, online_filter
from or1.config.loading import dump, load_recipe, resolve, stage_names
from or1.config.schema import RunConfig
from or1.data.records import prompt_key
from or1.data.schema import read_rows
from or1.errors import UserError
from or1.hybrid import ResourcePool, WorkerError, WorkerGroup, colocate, ray_session
from or1.hybrid.cluster import local_cpus
from or1.layout import (
    CONFIG_FILE,
    FINAL_CRITIC_DIR,
    FINAL_DIR,
    METRICS_FILE,
    PROMPT_STATS_FILE,
    SUMMARY_FILE,
    run_directory,
    stage_directory,
)
from or1.preflight import check_runnable, check_train, uses_gpu
from or1.report import refresh_report
from or1.stop import StopFlag
from or1.tokens import load_tokenizer
from or1.trainer.checkpoint import CheckpointManager
from or1.trainer.loop import Trainer, restore, train
from or1.trainer.metrics import MetricsLogger
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.rewards import RewardManager
from or1.trainer.summary import stage_summary, summary_lines, write_summary
from or1.trainer.validation import ValidationSet, load_validation_sets
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker
from or1.workers.critic import CriticWorker

# Settings that change how a run is operated, not what it computes: a resume may change them freely.
OPERATIONAL_KEYS = (
    "trainer.steps",  # training a stage longer (or ending it sooner) leaves the steps already done as they were
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
)


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


def train_in_session(
    cfg: RunConfig,
    stage_dir: Path,
    model_path: str,
    critic_path: str | None,
    resume: str,
    ray_address: str | None,
    console: Console,
    stop: StopFlag | None = None,
) -> tuple[Trainer, dict[str, int]]:
    """Start Ray and the workers, resume (auto) or start fresh, train the stage to its end and export it."""
    stop = stop or StopFlag()
    with ray_session(ray_address, num_cpus=local_cpus(cfg.world_size)):  # joins the CLI's Ray when it runs
        stop.install()  # ray.init replaced the SIGTERM handler with one that exits mid-call
        rewards = RewardManager(cfg.reward)
        with ThreadPoolExecutor(1) as starter:
            # The ranks import their libraries and load the model (seconds) while this process reads the prompts.
            starting = starter.submit(start_actor_groups, cfg, model_path, critic_path)
            try:
                keep, dropped = filtered_prompts(cfg, stage_dir, console)
                data = load_stage_data(cfg, model_path, keep, console)
            except BaseException:
                with suppress(Exception):  # the data's error is the one to report
                    starting.result()[0].shutdown()
                raise
            actor, critic = starting.result()
        try:
            trainer = build_trainer(cfg, stage_dir, data, actor, critic, rewards, console)
            trainer.stop = stop
            trainer.checkpoints.sweep_partial()
            latest = trainer.checkpoints.latest() if resume == "auto" else None
            if latest is not None:
                console.print(f"resuming stage {cfg.stage.index} from {latest}", markup=False)
                restore(trainer, latest)
            else:
                trainer.logger.truncate_after(-1)  # steps an earlier attempt logged before any checkpoint
            try:
                train(trainer)
            finally:
                trainer.logger.close()
            stop.raise_if_requested(
                f"stopped after the last step ({trainer.step}), before exporting the final model; "
                f"checkpoint {trainer.checkpoints.latest()}"
            )
            trainer.prompt_stats.save(stage_dir / PROMPT_STATS_FILE)
            actor.export_model(str(stage_dir / FINAL_DIR))
            if critic is not None:
                critic.export_model(str(stage_dir / FINAL_CRITIC_DIR))
        finally:
            actor.shutdown()  # colocated roles (the critic) go with it
    return trainer, dropped


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


def critic_start(cfg: RunConfig, run_dir: Path, model_path: str) -> str:
    """The critic's start folder: stage N-1's final critic, else critic.model_path, else the stage's start policy."""
    if cfg.stage.index > 1:
        previous = stage_directory(run_dir, cfg.stage.index - 1) / FINAL_CRITIC_DIR
        if (previous / "config.json").is_file():
            return str(previous)
    path = cfg.critic.model_path or model_path
    if not Path(path).is_dir():
        raise UserError(f"critic.model_path: {path} is not a model folder (relative to {Path.cwd()})")
    return path


def start_actor_groups(
    cfg: RunConfig, model_path: str, critic_path: str | None
) -> tuple[WorkerGroup, WorkerGroup | None]:
    """The actor/rollout(/ref) group on nnodes x devices_per_node ranks with the critic (GAE) colocated in the same
    processes, models loaded; shut down if loading fails."""
    threads = cfg.trainer.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.world_size)
    pool = ResourcePool(cfg.trainer.nnodes, cfg.trainer.devices_per_node, use_gpu=uses_gpu(cfg))
    env = {"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}
    roles = {
        "actor_rollout": (
            ActorRolloutRefWorker,
            {"config": cfg, "model_path": model_path, "threads": threads},
        )
    }
    if critic_path is not None:
        roles["critic"] = (CriticWorker, {"config": cfg, "model_path": critic_path, "threads": threads})
    groups = colocate(pool, roles, name="actor", env=env)
    actor, critic = groups["actor_rollout"], groups.get("critic")
    try:
        actor.init_model()
        if critic is not None:
            critic.init_model()
    except BaseException:
        actor.shutdown()  # colocated roles share the actors: this ends the critic too
        raise
    return actor, critic


@dataclass
class StageData:
    """What a stage trains and validates on, read while the workers start."""

    loader: PromptLoader
    validation: list[ValidationSet]


def load_stage_data(cfg: RunConfig, model_path: str, keep: set[str] | None, console: Console) -> StageData:
    """The training prompts in `keep` (None: every prompt of data.train_files) and the validation sets, tokenized."""
    tokenizer = load_tokenizer(model_path)
    loader = PromptLoader(
        cfg.data.train_files,
        tokenizer,
        batch_size=cfg.trainer.batch_size,
        max_prompt_length=cfg.data.max_prompt_length,
        seed=cfg.trainer.seed,
        shuffle=cfg.data.shuffle,
        keep_keys=keep,
    )
    if loader.too_long:
        console.print(f"dropped {loader.too_long} prompts longer than {cfg.data.max_prompt_length} tokens")
    return StageData(loader, load_validation_sets(cfg, tokenizer))


def build_trainer(
    cfg: RunConfig,
    stage_dir: Path,
    data: StageData,
    actor: WorkerGroup,
    critic: WorkerGroup | None,
    rewards: RewardManager,
    console: Console,
) -> Trainer:
    """The stage's trainer over `data` with the started worker groups."""
    return Trainer(
        cfg=cfg,
        actor=actor,
        critic=critic,
        rewards=rewards,
        loader=data.loader,
        entropy=AdaptiveEntropyController.from_config(cfg.algorithm.entropy),
        checkpoints=CheckpointManager(stage_dir, cfg.trainer.keep_checkpoints),
        logger=MetricsLogger(
            stage_dir,
            list(cfg.trainer.loggers),
            cfg.trainer.steps,
            console,
            wandb_project=cfg.trainer.wandb_project,
            wandb_run_name=cfg.trainer.wandb_run_name or f"{cfg.recipe}-stage{cfg.stage.index}",
        ),
        validation=data.validation,
    )


def filtered_prompts(
    cfg: RunConfig, stage_dir: Path, console: Console
) -> tuple[set[str] | None, dict[str, int]]:
    """Prompt keys kept after online filtering (None: no filter) and the count each earlier stage dropped.

    A prompt solved every time in any earlier stage stays dropped.
    """
    if cfg.stage.index == 1 or not cfg.algorithm.online_filter:
        return None, {}
    dropped = {}
    kept = [prompt_key(row) for f in cfg.data.train_files for row in read_rows(f)]
    total = len(kept)
    for earlier in range(1, cfg.stage.index):
        stats = PromptStats.load(stage_directory(stage_dir.parent, earlier) / PROMPT_STATS_FILE)
        kept, report = online_filter(kept, stats, cfg.algorithm.online_filter_threshold)
        dropped[f"stage{earlier}"] = report.dropped
        console.print(
            f"online filter: dropped {report.dropped} prompts solved every time in stage {earlier} "
            f"(threshold {report.threshold:g})"
        )
    console.print(f"online filter: {len(kept)} of {total} prompts left for stage {cfg.stage.index}")
    return set(kept), dropped
