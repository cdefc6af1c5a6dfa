"""`or1 train`: resolve a stage, check it can run here, start the worker groups, resume, train, export.

Run directory layout (DESIGN.md): <run_dir>/stage<N>/{config.yaml, metrics.jsonl, tensorboard/, checkpoints/,
prompt_stats.parquet, final/, summary.json} (+ final_critic/ under GAE). Stage N > 1 starts from
<run_dir>/stage<N-1>/final (and its final_critic) and drops the prompts that earlier stages always solved
(algorithm.online_filter).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from rich.console import Console

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.algos.online_filter import PROMPT_STATS_FILE, PromptStats, online_filter
from or1.config.loading import dump, load_recipe, resolve, stage_names
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.hybrid import ResourcePool, WorkerError, WorkerGroup, colocate, ray_session
from or1.engines.loading import load_tokenizer
from or1.report import refresh_report
from or1.trainer.checkpoint import CheckpointManager
from or1.trainer.data import PromptLoader, prompt_key, read_prompt_rows
from or1.trainer.loop import Trainer, restore, train
from or1.trainer.metrics import MetricsLogger
from or1.trainer.summary import stage_summary, summary_lines, write_summary
from or1.trainer.validation import load_validation_sets
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker
from or1.workers.critic import CriticWorker
from or1.workers.reward import RewardWorker

FINAL_DIR = "final"
FINAL_CRITIC_DIR = "final_critic"


def run_directory(cfg: RunConfig, run_dir: Path | str | None) -> Path:
    """The run directory: the one given, else runs/<recipe name>."""
    return Path(run_dir) if run_dir is not None else Path("runs") / cfg.recipe


def stage_directory(run_dir: Path, index: int) -> Path:
    return run_dir / f"stage{index}"


def run_train(
    recipe: str,
    stage: str,
    run_dir: Path | None = None,
    overrides: list[str] | None = None,
    resume: str = "auto",
    ray_address: str | None = None,
    console: Console | None = None,
) -> Path:
    """Train one stage of a recipe; returns the stage's exported final model folder."""
    console = console or Console(soft_wrap=True)  # paths and counts stay on one line, also in logs
    cfg = resolve(recipe, stage, overrides or [])
    if resume not in ("auto", "never"):
        raise UserError(f"--resume {resume}: expected auto or never")
    run_dir = run_directory(cfg, run_dir)
    stage_dir = stage_directory(run_dir, cfg.stage.index)
    model_path = check_runnable(cfg, run_dir)
    # config.yaml records what this stage really starts from (stage N > 1: stage N-1's final)
    cfg.model.path = model_path
    if resume == "never" and stage_dir.exists():
        shutil.rmtree(stage_dir)  # a fresh start: old checkpoints and metrics would mix with the new run
    stage_dir.mkdir(parents=True, exist_ok=True)
    (stage_dir / "config.yaml").write_text(dump(cfg))
    critic_path = critic_start(cfg, run_dir, model_path) if cfg.uses_critic else None
    console.print(f"stage {cfg.stage.index} of {cfg.recipe} starts from {model_path}")
    for attempt in range(cfg.trainer.max_restarts + 1):
        try:
            trainer, dropped = train_in_session(
                cfg,
                stage_dir,
                model_path,
                critic_path,
                resume if attempt == 0 else "auto",
                ray_address,
                console,
            )
            break
        except WorkerError as err:
            # a process died (a native crash, the OOM killer): the committed checkpoints are intact
            if not err.died or attempt == cfg.trainer.max_restarts:
                raise
            console.print(
                f"[yellow]{err}; restarting the workers from the latest checkpoint "
                f"(restart {attempt + 1} of at most {cfg.trainer.max_restarts})[/yellow]"
            )
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
        console.print(line, highlight=False)
    console.print(f"stage {cfg.stage.index} done: final model in {final}")
    refresh_report(stage_dir.parent, console)  # plots/ and report.md of the whole run so far
    return final


def train_in_session(
    cfg: RunConfig,
    stage_dir: Path,
    model_path: str,
    critic_path: str | None,
    resume: str,
    ray_address: str | None,
    console: Console,
) -> tuple[Trainer, dict[str, int]]:
    """Start Ray and the workers, resume (auto) or start fresh, train the stage to its end and export it."""
    with ray_session(ray_address, num_cpus=max(os.cpu_count() or 1, cfg.world_size + 1)):
        actor, critic, rewards = start_workers(cfg, model_path, critic_path)
        try:
            keep, dropped = filtered_prompts(cfg, stage_dir, console)
            trainer = build_trainer(cfg, stage_dir, model_path, keep, actor, critic, rewards, console)
            trainer.checkpoints.sweep_partial()
            latest = trainer.checkpoints.latest() if resume == "auto" else None
            if latest is not None:
                console.print(f"resuming stage {cfg.stage.index} from {latest}")
                restore(trainer, latest)
            else:
                trainer.logger.truncate_after(-1)  # steps an earlier attempt logged before any checkpoint
            train(trainer)
            trainer.logger.close()
            trainer.prompt_stats.save(stage_dir / PROMPT_STATS_FILE)
            actor.export_model(str(stage_dir / FINAL_DIR))
            if critic is not None:
                critic.export_model(str(stage_dir / FINAL_CRITIC_DIR))
        finally:
            actor.shutdown()
            rewards.shutdown()
    return trainer, dropped


def run_all_stages(
    recipe: str,
    run_dir: Path | None = None,
    overrides: list[str] | None = None,
    resume: str = "auto",
    ray_address: str | None = None,
    console: Console | None = None,
) -> Path:
    """`--stage all`: run the recipe's stages in order, skipping (with resume auto) those already finished."""
    console = console or Console(soft_wrap=True)  # paths and counts stay on one line, also in logs
    _, raw = load_recipe(recipe)
    final = None
    for index in range(1, len(stage_names(raw)) + 1):
        cfg = resolve(recipe, index, overrides or [])
        stage_final = stage_directory(run_directory(cfg, run_dir), index) / FINAL_DIR
        if resume == "auto" and (stage_final / "config.json").is_file():
            console.print(f"stage {index} already finished: {stage_final}")
            final = stage_final
            continue
        final = run_train(recipe, str(index), run_dir, overrides, resume, ray_address, console)
    assert final is not None  # a recipe has at least one stage (load_recipe checks)
    return final


def check_runnable(cfg: RunConfig, run_dir: Path) -> str:
    """The model folder this stage starts from; a UserError for what this machine or run cannot do."""
    device = cfg.trainer.device
    if device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            f"recipe {cfg.recipe} needs CUDA GPUs (trainer.device: cuda) and none is visible; "
            "run it on a GPU node or use a CPU recipe such as stages/tiny.yaml"
        )
    on_cpu = device == "cpu" or (device == "auto" and not torch.cuda.is_available())
    if on_cpu and cfg.rollout.engine == "vllm":
        raise UserError(
            f"recipe {cfg.recipe} uses rollout.engine=vllm, which needs a GPU; on CPU pass "
            "--set rollout.engine=hf (and trainer.device=cpu)"
        )
    if not on_cpu:
        raise UserError(
            "the GPU training path (NCCL, vLLM, offload) is not built yet; use trainer.device=cpu"
        )
    if cfg.trainer.steps is None:
        raise UserError(
            f"stage {cfg.stage.name} of {cfg.recipe} has no step count; pass --set trainer.steps=N"
        )
    for f in cfg.data.train_files:
        if not Path(f).is_file():
            raise UserError(
                f"data.train_files: {f} is not a file (relative to {Path.cwd()}); write it first "
                "(or1 prepare-data --preset tiny for the tiny recipe) or fix the path"
            )
    if cfg.stage.index > 1:
        previous = stage_directory(run_dir, cfg.stage.index - 1) / FINAL_DIR
        if not (previous / "config.json").is_file():
            raise UserError(
                f"stage {cfg.stage.index} starts from stage {cfg.stage.index - 1}'s final model, but "
                f"{previous} does not exist; run --stage {cfg.stage.index - 1} first"
            )
        return str(previous)
    if not Path(cfg.model.path).is_dir():
        raise UserError(
            f"model.path: {cfg.model.path} is not a model folder (relative to {Path.cwd()}); "
            "build it first (or1 init-model) or fix the path"
        )
    return cfg.model.path


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


def start_workers(
    cfg: RunConfig, model_path: str, critic_path: str | None = None
) -> tuple[WorkerGroup, WorkerGroup | None, WorkerGroup]:
    """The actor/rollout(/ref) group on nnodes x devices_per_node ranks with the critic (GAE) colocated in the same
    processes, and one reward rank beside them."""
    threads = cfg.trainer.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.world_size)
    pool = ResourcePool(cfg.trainer.nnodes, cfg.trainer.devices_per_node, use_gpu=False)
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
    actor.init_model()
    if critic is not None:
        critic.init_model()
    rewards = WorkerGroup(
        ResourcePool(1, 1, use_gpu=False),
        RewardWorker,
        init_kwargs={"config": cfg.reward},
        name="reward",
        env={"OMP_NUM_THREADS": "1"},
    )
    return actor, critic, rewards


def build_trainer(
    cfg: RunConfig,
    stage_dir: Path,
    model_path: str,
    keep: set[str] | None,
    actor: WorkerGroup,
    critic: WorkerGroup | None,
    rewards: WorkerGroup,
    console: Console,
) -> Trainer:
    """The stage's trainer over the prompts in `keep` (None: every prompt of data.train_files)."""
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
    return Trainer(
        cfg=cfg,
        actor=actor,
        critic=critic,
        rewards=rewards,
        loader=loader,
        entropy=AdaptiveEntropyController.from_config(cfg.algorithm.entropy),
        checkpoints=CheckpointManager(stage_dir, cfg.trainer.keep_checkpoints),
        logger=MetricsLogger(stage_dir, list(cfg.trainer.loggers), cfg.trainer.steps, console),
        validation=load_validation_sets(cfg, tokenizer),
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
    kept = [prompt_key(row) for f in cfg.data.train_files for row in read_prompt_rows(f)]
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
