"""The controller's training loop: one stage of GRPO / MAGIC, reading like the step of the HybridFlow design
(docs/ARCHITECTURE.md, "One training step through the layers").

The controller holds no weights: it moves Batches between the actor/rollout worker group, the critic (GAE only) and
the reward manager, and keeps the small state of the algorithm (step, data position, entropy controller,
prompt statistics, skipped steps), which its CheckpointManager saves with the workers' parts (`checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.algos.online_filter import PromptStats
from or1.config.schema import RunConfig
from or1.health import Advisor
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    CRITIC_COLUMNS,
    IS_WEIGHTS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
    SEQUENCE_COLUMNS,
    UPDATE_COLUMNS,
)
from or1.hybrid.worker_group import WorkerGroup
from or1.scoring import RewardManager
from or1.stop import StopFlag
from or1.trainer.checkpoint import CheckpointManager
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
)
from or1.trainer.placement import RolloutPlacement
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.skipped import SkippedSteps
from or1.trainer.step_log import MetricsLogger, PhaseTimer, write_step_samples
from or1.trainer.step_sampler import ConsumedLoader, Sampled
from or1.trainer.throughput import Throughput
from or1.trainer.validation import ValidationSet, is_due, validate


@dataclass
class Trainer:
    """Everything the loop touches: worker groups, data, algorithm state, sinks."""

    cfg: RunConfig
    actor: WorkerGroup  # ActorRolloutRefWorker on every data-parallel rank
    rewards: RewardManager  # the verifiers' front-end, in this process
    loader: PromptLoader
    entropy: AdaptiveEntropyController
    # saves and loads the worker groups and the controller's parts (build_trainer names them)
    checkpoints: CheckpointManager
    logger: MetricsLogger
    skipped: SkippedSteps
    placement: RolloutPlacement  # where the steps are sampled (rollout.placement)
    position: ConsumedLoader  # the loader's position as checkpointed: after the last step trained
    prompt_stats: PromptStats = field(default_factory=PromptStats)
    validation: list[ValidationSet] = field(default_factory=list)  # data.validation.sets, encoded
    critic: WorkerGroup | None = None  # CriticWorker colocated with the actor; only for the gae advantage
    throughput: Throughput | None = None  # the perf/ rates and MFU (None: only perf/tokens_per_s)
    step: int = 0  # steps of this stage completed
    stop: StopFlag | None = None  # set by Ctrl-C / SIGTERM: stop between steps, after a checkpoint
    # run-health and stop rules over the logged steps (trainer.health and trainer.until when None)
    advisor: Advisor | None = None

    def __post_init__(self) -> None:
        if self.advisor is None:
            self.advisor = Advisor(self.cfg.trainer.health, self.cfg.trainer.until)

    @property
    def done(self) -> bool:
        """The stage is over: at trainer.steps, or ended sooner by a stop rule (trainer.until)."""
        return self.step >= self.cfg.trainer.steps or self.advisor.ended is not None


def train(t: Trainer) -> None:
    """Run the stage from t.step to trainer.steps or the step a stop rule ends it at, checkpointing every
    save_every steps and at the end."""
    cfg = t.cfg
    if t.stop is not None and t.stop.requested:
        stop_between_steps(t)
    if t.done:  # resumed from the stage's last checkpoint
        return
    t.logger.start_progress(t.step)
    if t.validation and t.step == 0:  # the starting point of the stage's validation curve
        validation = run_validation(t, 0)
        t.logger.log(0, validation)
        t.advisor.observe_validation(0, validation)
    t.placement.begin(t.step)
    try:
        while not t.done:
            if t.stop is not None and t.stop.requested:
                stop_between_steps(t)
            step, timer = t.step + 1, PhaseTimer()
            sampled = t.placement.take(step, timer)
            consume(t, sampled)
            batch, rejection = rejection_sample(sampled.batch, cfg.algorithm, multiple=t.actor.world_size)
            if rejection.skip:
                reasons = reason_counts(sampled.first)
                published = t.placement.trained(step)  # the same weights, under this step's version
                metrics = {
                    "skipped": 1.0,
                    **rollout_metrics(sampled.first, rejection),
                    **reasons,
                    **sampled.metrics,
                    **published,
                    **timer.metrics(),
                }
                _finish_step(t, step, {**metrics, **rates(t, metrics, timer, None)}, sampled.first)
                t.skipped.count(step, reasons)
                continue
            t.skipped.reset()
            batch, update, more = train_step(t, batch, timer)
            more = {**more, **sampled.metrics, **t.placement.trained(step)}
            metrics = step_metrics(
                sampled.first, rejection, batch, update, t.entropy.metrics(), timer.metrics()
            )
            _finish_step(t, step, {**metrics, **more, **rates(t, metrics, timer, batch)}, sampled.first)
    finally:
        t.placement.end()


def consume(t: Trainer, sampled: Sampled) -> None:
    """What training on a sampled step changes in the controller: the prompt statistics of every round sampled,
    and the loader's position a checkpoint records (not that of steps sampled ahead)."""
    for keys, rewards in sampled.rounds:
        t.prompt_stats.update(keys, rewards)
    t.position.consumed = sampled.loader_state


def train_step(
    t: Trainer, batch: Batch, timer: PhaseTimer
) -> tuple[Batch, dict[str, float], dict[str, float]]:
    """Log-probs, advantages, the actor's (and critic's) update on the kept groups: the batch with every column
    the step added, the actor update's metrics, and the sampler-mismatch, correction and critic/ metrics."""
    cfg, algo = t.cfg, t.cfg.algorithm
    if cfg.trainer.balance_batch:
        batch = balance_ranks(batch, t.actor.world_size)
    old = OldLogProbs.choose(t)
    batch = old.before_update(t, batch, timer)
    if algo.kl.enabled:
        with timer("ref_log_prob"):
            batch = batch.union(t.actor.compute_ref_log_prob(batch.only(SEQUENCE_COLUMNS)))
    if t.critic is not None:
        with timer("values"):
            batch = batch.union(t.critic.compute_values(batch.only(SEQUENCE_COLUMNS)))
    batch = add_advantages(batch, algo)
    loss_mask = batch.tensors[RESPONSE_MASK]  # before rejection: the mismatch metrics see every loss token
    if not old.fused:  # sampler unlike trainer: IS weights, rejection
        batch, correction = rollout_correction(batch, algo)
    alpha = old.entropy_coef(t, batch)
    with timer("update"):
        update = t.actor.update_actor(batch.only(old.update_columns(cfg, batch)), entropy_coef=alpha)[0]
        batch = old.after_update(t, batch, update, alpha)
    if old.fused:
        # the update weighed its tokens from its own forward: the same weights again, for the metrics
        batch, correction = rollout_correction(batch, algo)
    critic = {}
    if t.critic is not None:
        with timer("critic_update"):
            critic = t.critic.update_critic(batch.only(CRITIC_COLUMNS))[0]
    return (
        batch,
        update,
        {
            **sampler_mismatch(batch, algo, loss_mask),
            **correction,
            **{f"critic/{k}": v for k, v in critic.items()},
        },
    )


def stop_between_steps(t: Trainer) -> None:
    """Ctrl-C / SIGTERM arrived: checkpoint the last finished step unless it already is, then raise Interrupted."""
    assert t.stop is not None
    latest = t.checkpoints.latest()
    if t.step > 0 and latest != t.checkpoints.folder(t.step):
        latest = t.checkpoints.save(t.step)
    where = f"checkpoint {latest}" if t.step > 0 else "no step finished, nothing to keep"
    t.stop.raise_if_requested(f"stopped after step {t.step} of {t.cfg.trainer.steps} ({where})")


def run_validation(t: Trainer, step: int) -> dict[str, float]:
    """The validation sets sampled with the weights after `step`, wherever the rollout engines are."""
    with t.placement.validating(step) as engines:
        return validate(t.validation, engines, t.rewards, t.cfg)


def rates(
    t: Trainer, timings: dict[str, float], timer: PhaseTimer, trained: Batch | None
) -> dict[str, float]:
    """The step's perf/ throughput and MFU (`throughput`); none without a Throughput."""
    if t.throughput is None:
        return {}
    return t.throughput.metrics(timings, timer.generated, trained)


def _finish_step(t: Trainer, step: int, metrics: dict[str, float], sampled: Batch | None = None) -> None:
    """Advance, validate and checkpoint on schedule (the stage's last step always does both, also where a stop rule
    ends it), log, keep a few samples."""
    t.step = step
    fired = t.advisor.observe_step(step, metrics)
    if t.validation and (is_due(t.cfg, step) or t.done):
        validation = run_validation(t, step)
        metrics = {**metrics, **validation}
        fired += t.advisor.observe_validation(step, validation)
    t.logger.log(step, metrics)
    lines = [advisory.line() for advisory in fired]
    if t.advisor.ended is not None:  # at this step: the stage ends with it
        lines.append(
            f"stage {t.cfg.stage.name} ends at step {step} of {t.cfg.trainer.steps}: {t.advisor.ended.line()}"
        )
    for line in lines:
        t.logger.console.print(line, highlight=False, soft_wrap=True, markup=False)
    if sampled is not None:
        write_step_samples(t.logger.stage_dir, step, sampled, t.cfg.trainer.samples_per_step)
    if step % t.cfg.trainer.save_every == 0 or t.done:
        t.checkpoints.save(t.step)


class OldLogProbs:
    """Where a step's old log-probs come from, and what follows from that choice: a pass of their own before the
    update, and the entropy controller stepped on the sampled responses' entropy."""

    fused = False

    @staticmethod
    def choose(t: Trainer) -> OldLogProbs:
        """On-policy steps (`fuses_old_log_prob`) take them from the update's own forward."""
        return FusedOldLogProbs() if fuses_old_log_prob(t.cfg, t.entropy) else OldLogProbs()

    def before_update(self, t: Trainer, batch: Batch, timer: PhaseTimer) -> Batch:
        with timer("old_log_prob"):
            return batch.union(t.actor.compute_log_prob(batch.only(SEQUENCE_COLUMNS)))

    def entropy_coef(self, t: Trainer, batch: Batch) -> float:
        return t.entropy.step(sampled_entropy(batch))

    def after_update(self, t: Trainer, batch: Batch, update: dict[str, float], alpha: float) -> Batch:
        return batch

    def update_columns(self, cfg: RunConfig, batch: Batch) -> tuple[str, ...]:
        kl = cfg.algorithm.kl
        columns = tuple(c for c in UPDATE_COLUMNS if not (self.fused and c == OLD_LOG_PROBS))
        columns = (*columns, IS_WEIGHTS) if IS_WEIGHTS in batch else columns
        if self.fused and cfg.algorithm.rollout_correction.is_level != "off":
            columns = (*columns, ROLLOUT_LOG_PROBS)  # the update computes its importance weights itself
        return (*columns, REF_LOG_PROBS) if kl.enabled and not kl.in_reward else columns


class FusedOldLogProbs(OldLogProbs):
    """On-policy: the update's forward gives the old log-probs (fetched back for the mismatch metrics) and the
    entropy e_k of the weights before the step; the coefficient of this step comes from the sampler's entropy."""

    fused = True

    def before_update(self, t: Trainer, batch: Batch, timer: PhaseTimer) -> Batch:
        return batch

    def entropy_coef(self, t: Trainer, batch: Batch) -> float:
        return t.entropy.alpha_before(rollout_entropy(batch))

    def after_update(self, t: Trainer, batch: Batch, update: dict[str, float], alpha: float) -> Batch:
        batch = batch.union(t.actor.fused_old_log_probs(batch.only([RESPONSE_MASK])))
        t.entropy.step(update["sampled_entropy"], alpha=alpha)
        return batch


def restore(t: Trainer, folder: Path) -> None:
    """Load a checkpoint into the workers and the controller; the metrics file is cut back to its step."""
    t.step = t.checkpoints.load(folder)
    t.logger.truncate_after(t.step)
    # what fired stays fired, and a stop rule decides at the same step
    t.advisor = Advisor.replaying(t.logger.records(), t.cfg.trainer.health, t.cfg.trainer.until)
