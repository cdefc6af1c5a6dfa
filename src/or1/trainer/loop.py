"""The controller's training loop: one stage of GRPO / MAGIC, reading like the step of the HybridFlow design (README).

The controller holds no weights: it moves Batches between the actor/rollout worker group, the critic (GAE only) and
the reward manager, and keeps the small state of the algorithm (step, data position, entropy controller,
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
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    CRITIC_COLUMNS,
    IS_WEIGHTS,
    OLD_LOG_PROBS,
    PROMPT_KEY,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    REWARD_COLUMNS,
    REWARD_HIDDEN,
    REWARD_SECONDS,
    REWARDS,
    SEQUENCE_COLUMNS,
    UID,
    UPDATE_COLUMNS,
)
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import WorkerGroup
from or1.stop import StopFlag
from or1.trainer import checkpoint as ckpt
from or1.trainer.metrics import MetricsLogger, PhaseTimer, write_step_samples
from or1.trainer.phases import (
    add_advantages,
    balance_ranks,
    fuses_old_log_prob,
    reason_counts,
    rejection_sample,
    rollout_correction,
    rollout_entropy,
    rollout_metrics,
    sampled_entropy,
    sampler_mismatch,
    step_metrics,
    truncation_policy,
)
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.rewards import RewardManager
from or1.trainer.validation import ValidationSet, is_due, validate
from or1.workers.actor_rollout_ref import MODEL_DIR


@dataclass
class Trainer:
    """Everything the loop touches: worker groups, data, algorithm state, sinks."""

    cfg: RunConfig
    actor: WorkerGroup  # ActorRolloutRefWorker on every data-parallel rank
    rewards: RewardManager  # the verifiers' front-end, in this process
    loader: PromptLoader
    entropy: AdaptiveEntropyController
    checkpoints: ckpt.CheckpointManager
    logger: MetricsLogger
    prompt_stats: PromptStats = field(default_factory=PromptStats)
    validation: list[ValidationSet] = field(default_factory=list)  # data.validation.sets, encoded
    critic: WorkerGroup | None = None  # CriticWorker colocated with the actor; only for the gae advantage
    step: int = 0  # steps of this stage completed
    skipped_in_a_row: int = 0  # consecutive steps without a group with reward variance
    # the verifier reasons of those steps: reward/reason_<r> -> the sum of each step's fraction
    skipped_reasons: dict[str, float] = field(default_factory=dict)
    stop: StopFlag | None = None  # set by Ctrl-C / SIGTERM: stop between steps, after a checkpoint


def train(t: Trainer) -> None:
    """Run the stage from t.step to trainer.steps, checkpointing every save_every steps and at the end."""
    cfg, algo = t.cfg, t.cfg.algorithm
    if t.stop is not None and t.stop.requested:
        stop_between_steps(t)
    t.logger.start_progress(t.step)
    if t.validation and t.step == 0:  # the starting point of the stage's validation curve
        t.logger.log(0, validate(t.validation, t.actor, t.rewards, cfg))
    while t.step < cfg.trainer.steps:
        if t.stop is not None and t.stop.requested:
            stop_between_steps(t)
        step, timer = t.step + 1, PhaseTimer()
        batch = sampled = sample_round(t, step, 0, timer)
        if algo.refill:
            batch = refill(t, step, batch, timer)
        batch, rejection = rejection_sample(batch, algo, multiple=t.actor.world_size)
        if rejection.skip:
            reasons = reason_counts(sampled)
            metrics = {"skipped": 1.0, **rollout_metrics(sampled, rejection), **reasons, **timer.metrics()}
            _finish_step(t, step, metrics, sampled)
            _count_skipped(t, reasons)
            continue
        t.skipped_in_a_row, t.skipped_reasons = 0, {}
        if cfg.trainer.balance_batch:
            batch = balance_ranks(batch, t.actor.world_size)
        fused = fuses_old_log_prob(cfg, t.entropy)  # on-policy: the update's forward gives the old log-probs
        if not fused:
            with timer("old_log_prob"):
                batch = batch.union(t.actor.compute_log_prob(batch.only(SEQUENCE_COLUMNS)))
        if algo.kl.enabled:
            with timer("ref_log_prob"):
                batch = batch.union(t.actor.compute_ref_log_prob(batch.only(SEQUENCE_COLUMNS)))
        if t.critic is not None:
            with timer("values"):
                batch = batch.union(t.critic.compute_values(batch.only(SEQUENCE_COLUMNS)))
        batch = add_advantages(batch, algo)
        batch, correction = rollout_correction(batch, algo)  # sampler unlike trainer: IS weights, rejection
        if fused:
            alpha = t.entropy.alpha_before(rollout_entropy(batch))
        else:
            alpha = t.entropy.step(sampled_entropy(batch))
        columns = _update_columns(cfg, fused, batch)
        with timer("update"):
            update = t.actor.update_actor(batch.only(columns), entropy_coef=alpha)[0]
            if fused:  # the old log-probs the update's own forward took (the mismatch metrics read them)
                batch = batch.union(t.actor.fused_old_log_probs(batch.only([RESPONSE_MASK])))
        if fused:  # e_k of the weights before the step, from the update's own forward
            t.entropy.step(update["sampled_entropy"], alpha=alpha)
        critic = {}
        if t.critic is not None:
            with timer("critic_update"):
                critic = t.critic.update_critic(batch.only(CRITIC_COLUMNS))[0]
        metrics = step_metrics(sampled, rejection, batch, update, t.entropy.metrics(), timer.metrics())
        metrics.update({**sampler_mismatch(batch, algo), **correction})
        _finish_step(t, step, {**metrics, **{f"critic/{k}": v for k, v in critic.items()}}, sampled)


def stop_between_steps(t: Trainer) -> None:
    """Ctrl-C / SIGTERM arrived: checkpoint the last finished step unless it already is, then raise Interrupted."""
    assert t.stop is not None
    latest = t.checkpoints.latest()
    if t.step > 0 and (latest is None or latest.name != f"step_{t.step}"):
        latest = save(t)
    where = f"checkpoint {latest}" if t.step > 0 else "no step finished, nothing to keep"
    t.stop.raise_if_requested(f"stopped after step {t.step} of {t.cfg.trainer.steps} ({where})")


def _count_skipped(t: Trainer, reasons: dict[str, float]) -> None:
    """Stop a stage that cannot learn: trainer.max_skipped_steps skipped steps in a row is a UserError."""
    t.skipped_in_a_row += 1
    for key, share in reasons.items():
        t.skipped_reasons[key] = t.skipped_reasons.get(key, 0.0) + share
    limit = t.cfg.trainer.max_skipped_steps
    if limit and t.skipped_in_a_row >= limit:
        shares = sorted(t.skipped_reasons.items(), key=lambda kv: -kv[1])
        told = ", ".join(
            f"{share / t.skipped_in_a_row:.0%} {key.removeprefix('reward/reason_')}" for key, share in shares
        )
        raise UserError(
            f"{t.skipped_in_a_row} steps in a row were skipped (no prompt group with reward variance, so "
            f"nothing to learn) up to step {t.step}; verifier reasons: {told or 'none recorded'}. Check that "
            "the data's ground truths match the answer format the model writes, the reward settings, and the "
            "model (a group all correct or all wrong teaches nothing); raise trainer.max_skipped_steps (0: never "
            "stop) to go on"
        )


def sample_round(t: Trainer, step: int, round_: int, timer: PhaseTimer) -> Batch:
    """Generate a batch of prompts' groups, score them, apply the truncation policy, count per-prompt solves.

    Rows are scored as they finish: the ranks stream each finished row's reward inputs into a scoring session while
    the others still decode, so only the scoring left after the last row (`time/reward`) is on the step's critical
    path; `time/reward_hidden` is the scoring that ran during generation.
    """
    session = t.rewards.session()

    def score_finished(_rank: int, rows: list[dict[str, Any]]) -> None:
        session.submit([row.pop("key") for row in rows], rows)

    with timer("generate"):
        prompts, request = t.loader.next_batch(step, round_), SamplingRequest.training(t.cfg, step, round_)
        batch = t.actor.stream("stream_sequences", score_finished, prompts, request)
    with timer("reward"):
        scored = t.rewards.compute_scores(batch.only(REWARD_COLUMNS), session)
        batch = truncation_policy(batch.union(Batch(scored.tensors, scored.non_tensor)), t.cfg.algorithm)
    for ability, seconds in scored.meta[REWARD_SECONDS].items():
        timer.add(f"reward_{ability}", seconds)
    timer.add("reward_hidden", scored.meta[REWARD_HIDDEN])
    t.prompt_stats.update(batch.non_tensor[PROMPT_KEY], batch.tensors[REWARDS])
    return batch


def refill(t: Trainer, step: int, first: Batch, timer: PhaseTimer) -> Batch:
    """DAPO-style dynamic sampling: more rounds of prompts until batch_size informative groups (or rounds run out)."""
    buffer = RefillBuffer(t.cfg.trainer.batch_size, t.cfg.algorithm.max_refill_rounds)
    parts, more = [], first
    while True:
        kept = more.select(buffer.add(more.tensors[REWARDS], more.non_tensor[UID]))
        # rounds differ in meta (seed); the loop needs none
        parts.append(Batch(kept.tensors, kept.non_tensor))
        if not buffer.needs_more:
            return Batch.concat(parts)
        more = sample_round(t, step, buffer.rounds, timer)


def _finish_step(t: Trainer, step: int, metrics: dict[str, float], sampled: Batch | None = None) -> None:
    """Advance, validate and checkpoint on schedule (the last step always does both), log, keep a few samples."""
    t.step = step
    if t.validation and is_due(t.cfg, step):
        metrics = {**metrics, **validate(t.validation, t.actor, t.rewards, t.cfg)}
    t.logger.log(step, metrics)
    if sampled is not None:
        write_step_samples(t.logger.stage_dir, step, sampled, t.cfg.trainer.samples_per_step)
    if step % t.cfg.trainer.save_every == 0 or step == t.cfg.trainer.steps:
        save(t)


def _update_columns(cfg: RunConfig, fused: bool, batch: Batch) -> tuple[str, ...]:
    kl = cfg.algorithm.kl
    columns = tuple(c for c in UPDATE_COLUMNS if not (fused and c == OLD_LOG_PROBS))
    columns = (*columns, IS_WEIGHTS) if IS_WEIGHTS in batch else columns
    return (*columns, REF_LOG_PROBS) if kl.enabled and not kl.in_reward else columns


def save(t: Trainer) -> Path:
    """Workers write model / optimizer / RNG into a .tmp folder, then the controller commits it atomically."""
    folder = t.checkpoints.begin(t.step)
    t.actor.save_checkpoint(str(folder))
    if t.critic is not None:
        t.critic.save_checkpoint(str(folder))
    # every rank's file, also those of ranks on other machines (a run directory not on shared storage fails here)
    rng_files = [f"rng_rank{rank}.pt" for rank in range(t.actor.world_size)]
    ckpt.check_visible(folder, [f"{MODEL_DIR}/config.json", *rng_files])
    return t.checkpoints.commit(folder, t.step, controller_state(t))


def controller_state(t: Trainer) -> dict[str, Any]:
    return {
        "step": t.step,
        "loader": t.loader.state_dict(),
        "entropy": t.entropy.state_dict(),
        "prompt_stats": t.prompt_stats.state_dict(),
        "rng": ckpt.controller_rng_state(),
        "skipped": {"in_a_row": t.skipped_in_a_row, "reasons": dict(t.skipped_reasons)},
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
    skipped = state.get("skipped", {})  # absent in checkpoints written before the skipped-step limit
    t.skipped_in_a_row = int(skipped.get("in_a_row", 0))
    t.skipped_reasons = dict(skipped.get("reasons", {}))
    t.logger.truncate_after(t.step)
