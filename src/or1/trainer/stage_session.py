"""One stage in the running Ray: start the worker groups while the controller reads the prompts, build the trainer,
resume or start fresh, train to the stage's end and export the final model (and critic)."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.algos.online_filter import PromptStats
from or1.config.schema import RunConfig
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.worker_group import WorkerGroup, colocate
from or1.layout import FINAL_CRITIC_DIR, FINAL_DIR, PROMPT_STATS_FILE
from or1.preflight import uses_gpu
from or1.rng import ProcessRNG
from or1.scoring import RewardManager
from or1.stop import StopFlag
from or1.tokens import load_tokenizer
from or1.trainer.checkpoint import CheckpointManager
from or1.trainer.colocated import Colocated
from or1.trainer.loop import Trainer, restore, train
from or1.trainer.placement import RolloutPlacement
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.separate import Separate
from or1.trainer.skipped import SkippedSteps
from or1.trainer.stage_start import StageStart, filtered_prompts
from or1.trainer.step_log import MetricsLogger
from or1.trainer.step_sampler import ConsumedLoader, StepSampler
from or1.trainer.throughput import Throughput
from or1.trainer.validation import ValidationSet, load_validation_sets
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker
from or1.workers.critic import CriticWorker
from or1.workers.rollout_worker import RolloutWorker


def train_in_session(
    start: StageStart, resume: str, console: Console, stop: StopFlag
) -> tuple[Trainer, dict[str, int]]:
    """Start the workers, resume (auto) or start fresh, train the stage to its end and export it. Ray is running
    (`or1.trainer.launch`), and `stop` watches the signals."""
    cfg, stage_dir = start.cfg, start.stage_dir
    rewards = RewardManager(cfg.reward)
    try:
        with ThreadPoolExecutor(1) as starter:
            # The ranks import their libraries and load the model (seconds) while this process reads the prompts.
            starting = starter.submit(start_worker_groups, cfg, start.model_path, start.critic_path)
            try:
                keep, dropped = filtered_prompts(cfg, stage_dir, console)
                data = load_stage_data(cfg, start.model_path, keep, console)
            except BaseException:
                with suppress(Exception):  # the data's error is the one to report
                    for group in starting.result():
                        if group is not None:
                            group.shutdown()
                raise
            actor, critic, replicas = starting.result()
        placement = choose_placement(
            StepSampler(cfg, data.loader, rewards),
            actor,
            replicas,
            lambda: start_rollout_replicas(cfg, start.model_path),
        )
        try:
            trainer = build_trainer(cfg, stage_dir, data, actor, critic, placement, console)
            # the ranks' peak FLOP/s, measured (CPU) or looked up (GPU) once per stage, for the update's MFU
            trainer.throughput = Throughput.of_stage(cfg, start.model_path, actor.device_peak())
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
            export_final(actor, start, trainer.step)
            if critic is not None:
                critic.export_model(str(stage_dir / FINAL_CRITIC_DIR))
        finally:
            placement.shutdown()
            actor.shutdown()  # colocated roles (the critic) go with it
    finally:
        rewards.close()  # cluster placement: its scorer actors
    return trainer, dropped


def choose_placement(
    sampler: StepSampler,
    actor: WorkerGroup,
    replicas: WorkerGroup | None,
    start_replicas: Callable[[], WorkerGroup],
) -> RolloutPlacement:
    """The stage's one placement: `Separate` when it started rollout replicas (rollout.placement separate), else
    `Colocated`."""
    if replicas is None:
        return Colocated(actor, sampler)
    return Separate(actor, sampler, replicas, start_replicas, sampler.cfg.trainer.max_restarts)


def start_worker_groups(
    cfg: RunConfig, model_path: str, critic_path: str | None
) -> tuple[WorkerGroup, WorkerGroup | None, WorkerGroup | None]:
    """The actor/rollout(/ref) group on nnodes x devices_per_node ranks with the critic (GAE) colocated in the same
    processes, and under rollout.placement separate the rollout replicas on their own devices; models loaded, and
    everything shut down if loading fails."""
    pool = ResourcePool(cfg.trainer.nnodes, cfg.trainer.devices_per_node, use_gpu=uses_gpu(cfg))
    threads = worker_threads(cfg)
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
        replicas = start_rollout_replicas(cfg, model_path) if cfg.rollout.placement == "separate" else None
    except BaseException:
        actor.shutdown()  # colocated roles share the actors: this ends the critic too
        raise
    return actor, critic, replicas


def export_final(actor: WorkerGroup, start: StageStart, step: int) -> None:
    """The stage's final model, written by the workers beside final/, checked against the live actor's log-probs,
    sealed with its model card and manifest.json and renamed onto final/ (`or1.export`); a failed check stops the
    chain with one line, the last checkpoint kept."""
    from or1.export import Source, check_stage_final, partial_folder, put_in_place

    final = start.stage_dir / FINAL_DIR
    partial = partial_folder(final)
    ids, log_probs, compute_dtype = actor.export_model(str(partial))[0]
    source = Source(start.stage_dir.parent, start.cfg.stage.index, step, final, start.stage_dir)
    check_stage_final(source, partial, ids, log_probs, compute_dtype)
    put_in_place(partial, final)


def start_rollout_replicas(cfg: RunConfig, model_path: str) -> WorkerGroup:
    """rollout.replicas engines of rollout.tensor_parallel_size devices each (one CPU core each on the CPU), on the
    stage's start weights."""
    threads = worker_threads(cfg)
    replicas = WorkerGroup(
        ResourcePool(1, cfg.rollout_devices, use_gpu=uses_gpu(cfg)),
        RolloutWorker,
        init_kwargs={"config": cfg, "model_path": model_path, "threads": threads},
        name="rollout",
        env={"OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"},
    )
    try:
        replicas.init_model()
    except BaseException:
        replicas.shutdown()
        raise
    return replicas


def worker_threads(cfg: RunConfig) -> int:
    """torch threads per worker process: trainer.threads_per_worker, else the machine's cores over every process."""
    return cfg.trainer.threads_per_worker or max(1, (os.cpu_count() or 1) // cfg.step_devices)


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
    placement: RolloutPlacement,
    console: Console,
) -> Trainer:
    """The stage's trainer over `data` with the started worker groups; its checkpoints hold the worker groups and
    the controller's stateful parts under the names below (controller.pt's keys)."""
    entropy = AdaptiveEntropyController.from_config(cfg.algorithm.entropy)
    prompt_stats = PromptStats()
    skipped = SkippedSteps(cfg.trainer.max_skipped_steps)
    position = ConsumedLoader(data.loader)
    parts = {
        "loader": position,
        "entropy": entropy,
        "prompt_stats": prompt_stats,
        "rng": ProcessRNG(),
        "skipped": skipped,
    }
    workers = [actor, *([critic] if critic is not None else []), *placement.checkpoint_parts()]
    return Trainer(
        cfg=cfg,
        actor=actor,
        critic=critic,
        rewards=placement.sampler.rewards,
        loader=data.loader,
        entropy=entropy,
        checkpoints=CheckpointManager(stage_dir, cfg.trainer.keep_checkpoints, workers, parts),
        logger=MetricsLogger(
            stage_dir,
            list(cfg.trainer.loggers),
            cfg.trainer.steps,
            console,
            wandb_project=cfg.trainer.wandb_project,
            wandb_run_name=cfg.trainer.wandb_run_name or f"{cfg.recipe}-stage{cfg.stage.index}",
        ),
        skipped=skipped,
        placement=placement,
        position=position,
        prompt_stats=prompt_stats,
        validation=data.validation,
    )
