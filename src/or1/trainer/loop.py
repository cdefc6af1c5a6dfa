"""The controller's training loop: one stage of GRPO / MAGIC, reading like the step in DESIGN.md.

The controller holds no weights: it moves Batches between the actor/rollout worker group, the critic (GAE only) and
the reward worker group, and keeps the small state of the algorithm (step, data position, entropy controller,
prompt statistics), which goes into every checkpoint with the workers' model, optimizer and RNG states.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.algos.filters import RefillBuffer
from or1.algos.online_filter import PromptStats
from or1.config.schema import RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.worker_group import WorkerGroup
from or1.trainer import checkpoint as ckpt
from or1.trainer.data import PromptLoader
from or1.trainer.metrics import MetricsLogger, PhaseTimer
from or1.trainer.phases import (
    add_advantages,
    rejection_sample,
    rollout_metrics,
    sampled_entropy,
    step_metrics,
    truncation_policy,
)
from or1.trainer.validation import ValidationSet, is_due, validate
from or1.workers.reward import REWARD_COLUMNS

LOG_PROB_COLUMNS = ("input_ids", "attention_mask", "responses", "response_mask")
UPDATE_COLUMNS = (*LOG_PROB_COLUMNS, "old_log_probs", "advantages")
CRITIC_COLUMNS = (*LOG_PROB_COLUMNS, "values", "returns")


@dataclass
class Trainer:
    """Everything the loop touches: worker groups, data, algorithm state, sinks."""

    cfg: RunConfig
    actor: WorkerGroup  # ActorRolloutRefWorker on every data-parallel rank
    rewards: WorkerGroup  # RewardWorker(s), in their own processes
    loader: PromptLoader
    entropy: AdaptiveEntropyController
    checkpoints: ckpt.CheckpointManager
    logger: MetricsLogger
    prompt_stats: PromptStats = field(default_factory=PromptStats)
    validation: list[ValidationSet] = field(default_factory=list)  # data.validation.sets, encoded
    critic: WorkerGroup | None = None  # CriticWorker colocated with the actor; only for the gae advantage
    step: int = 0  # steps of this stage completed


def train(t: Trainer) -> None:
    """Run the stage from t.step to trainer.steps, checkpointing every save_every steps and at the end."""
    cfg, algo = t.cfg, t.cfg.algorithm
    if t.validation and t.step == 0:  # the starting point of the stage's validation curve
        t.logger.log(0, validate(t.validation, t.actor, t.rewards, cfg))
    while t.step < cfg.trainer.steps:
        step, timer = t.step + 1, PhaseTimer()
        batch = sampled = sample_round(t, step, 0, timer)
        if algo.refill:
            batch = refill(t, step, batch, timer)
        batch, rejection = rejection_sample(batch, algo, multiple=t.actor.world_size)
        if rejection.skip:
            _finish_step(t, step, {"skipped": 1.0, **rollout_metrics(sampled, rejection), **timer.metrics()})
            continue
        with timer("old_log_prob"):
            batch = batch.union(t.actor.compute_log_prob(batch.only(LOG_PROB_COLUMNS)))
        if algo.kl.enabled:
            with timer("ref_log_prob"):
                batch = batch.union(t.actor.compute_ref_log_prob(batch.only(LOG_PROB_COLUMNS)))
        if t.critic is not None:
            with timer("values"):
                batch = batch.union(t.critic.compute_values(batch.only(LOG_PROB_COLUMNS)))
        batch = add_advantages(batch, algo)
        alpha = t.entropy.step(sampled_entropy(batch))
        with timer("update"):
            update = t.actor.update_actor(batch.only(_update_columns(cfg)), entropy_coef=alpha)[0]
        critic = {}
        if t.critic is not None:
            with timer("critic_update"):
                critic = t.critic.update_critic(batch.only(CRITIC_COLUMNS))[0]
        metrics = step_metrics(sampled, rejection, batch, update, t.entropy.metrics(), timer.metrics())
        _finish_step(t, step, {**metrics, **{f"critic/{k}": v for k, v in critic.items()}})


def sample_round(t: Trainer, step: int, round_: int, timer: PhaseTimer) -> Batch:
    """Generate a batch of prompts' groups, score them, apply the truncation policy, count per-prompt solves."""
    with timer("generate"):
        batch = t.actor.generate_sequences(t.loader.next_batch(step, round_))
    with timer("reward"):
        batch = truncation_policy(
            batch.union(t.rewards.compute_scores(batch.only(REWARD_COLUMNS))), t.cfg.algorithm
        )
    t.prompt_stats.update(batch.non_tensor["prompt_key"], batch.tensors["rewards"])
    return batch


def refill(t: Trainer, step: int, first: Batch, timer: PhaseTimer) -> Batch:
    """DAPO-style dynamic sampling: more rounds of prompts until batch_size informative groups (or rounds run out)."""
    buffer = RefillBuffer(t.cfg.trainer.batch_size, t.cfg.algorithm.max_refill_rounds)
    parts, more = [], first
    while True:
        kept = more.select(buffer.add(more.tensors["rewards"], more.non_tensor["uid"]))
        parts.append(
            Batch(kept.tensors, kept.non_tensor)
        )  # rounds differ in meta (seed); the loop needs none
        if not buffer.needs_more:
            return Batch.concat(parts)
        more = sample_round(t, step, buffer.rounds, timer)


def _finish_step(t: Trainer, step: int, metrics: dict[str, float]) -> None:
    """Advance, validate and checkpoint on schedule (the last step always does both), log."""
    t.step = step
    if t.validation and is_due(t.cfg, step):
        metrics = {**metrics, **validate(t.validation, t.actor, t.rewards, t.cfg)}
    t.logger.log(step, metrics)
    if step % t.cfg.trainer.save_every == 0 or step == t.cfg.trainer.steps:
        save(t)


def _update_columns(cfg: RunConfig) -> tuple[str, ...]:
    kl = cfg.algorithm.kl
    return (*UPDATE_COLUMNS, "ref_log_probs") if kl.enabled and not kl.in_reward else UPDATE_COLUMNS


def save(t: Trainer) -> Path:
    """Workers write model / optimizer / RNG into a .tmp folder, then the controller commits it atomically."""
    folder = t.checkpoints.begin(t.step)
    t.actor.save_checkpoint(str(folder))
    if t.critic is not None:
        t.critic.save_checkpoint(str(folder))
    return t.checkpoints.commit(folder, t.step, controller_state(t))


def controller_state(t: Trainer) -> dict[str, Any]:
    return {
        "step": t.step,
        "loader": t.loader.state_dict(),
        "entropy": t.entropy.state_dict(),
        "prompt_stats": t.prompt_stats.state_dict(),
        "rng": ckpt.controller_rng_state(),
    }


def restore(t: Trainer, folder: Path) -> None:
    """Load a checkpoint into the workers and the controller; the metrics file is cut back to its step."""
    state = ckpt.load_controller_state(folder)
    t.actor.load_checkpoint(str(folder))
    if t.critic is not None:
        t.critic.load_checkpoint(str(folder))
    t.step = int(state["step"])
    t.loader.load_state_dict(state["loader"])
    t.entropy.load_state_dict(state["entropy"])
    t.prompt_stats.load_state_dict(state["prompt_stats"])
    ckpt.restore_controller_rng(state["rng"])
    t.logger.truncate_after(t.step)
