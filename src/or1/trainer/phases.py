"""The controller-side phases of a training step: pure Batch -> Batch transforms, no workers, no weights.

Each function is one line of the loop in loop.py; they are small so the loop reads like the training step
(generate, score, truncation policy, rejection sampling, log-probs, advantages, update) and each phase is tested on
hand-made batches.
"""

from __future__ import annotations

import numpy as np
import torch

from or1.algos.advantages import AdvantageInputs, AdvantageParams, compute_advantages, scores_to_token_rewards
from or1.algos.entropy_control import AdaptiveEntropyController, entropy_estimate
from or1.algos.filters import RejectionStats, rejection_keep_indices
from or1.algos.losses import kl_penalty
from or1.algos.rollout_correction import CorrectionSettings, correct, mismatch_metrics
from or1.algos.truncation import apply_truncation_policy, overlong_penalty
from or1.config.schema import AlgorithmConfig, RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ABILITY,
    ADVANTAGES,
    ATTENTION_MASK,
    ENTROPY,
    IS_WEIGHTS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_LENGTH,
    RESPONSE_MASK,
    RETURNS,
    REWARDS,
    ROLLOUT_LOG_PROBS,
    SCORE_NODE,
    SCORE_REASON,
    SCORE_SECONDS,
    SCORES,
    TRUNCATED,
    UID,
    VALUES,
)
from or1.hybrid.dispatch import balanced_order
from or1.run_metrics import ENTROPY as ENTROPY_METRIC
from or1.run_metrics import (
    LENGTH_MAX,
    LENGTH_MEAN,
    REJECTED_FRAC,
    RESPONSE_TOKENS,
    REWARD_MEAN,
    SAMPLED,
    SLOWEST_ROW_SECONDS,
    SOLVE_ALL_FRAC,
    SOLVE_NONE_FRAC,
    STEP_SECONDS,
    TOKENS_PER_S,
    TRUNCATED_FRAC,
    ability_reward_mean,
)
from or1.scoring import slowest_rows


def truncation_policy(batch: Batch, algorithm: AlgorithmConfig) -> Batch:
    """`rewards` and the loss mask after the truncated-response policy (zero_reward or mask), plus DAPO's overlong
    penalty when algorithm.overlong.buffer is set (the budget: the responses' padded width, what they were sampled
    with)."""
    rewards, mask = apply_truncation_policy(
        batch.tensors[SCORES],
        batch.tensors[TRUNCATED],
        batch.tensors[RESPONSE_MASK],
        algorithm.truncated,
    )
    overlong = algorithm.overlong
    if overlong.buffer:
        lengths, budget = batch.tensors[RESPONSE_LENGTH], batch.tensors[RESPONSE_MASK].shape[1]
        rewards = rewards + overlong_penalty(lengths, budget, overlong.buffer, overlong.penalty).to(
            rewards.dtype
        )
    return Batch({**batch.tensors, REWARDS: rewards, RESPONSE_MASK: mask}, batch.non_tensor, batch.meta)


def rejection_sample(batch: Batch, algorithm: AlgorithmConfig, multiple: int) -> tuple[Batch, RejectionStats]:
    """Keep informative groups (reward variance > 0), trimmed to a multiple of the data-parallel size."""
    keep, stats = rejection_keep_indices(
        batch.tensors[REWARDS],
        batch.non_tensor[UID],
        multiple=multiple,
        drop_equal=algorithm.rejection_sampling,
    )
    return batch.select(keep), stats


def balance_ranks(batch: Batch, world_size: int) -> Batch:
    """The rows reordered so that each rank's share (DP_COMPUTE splits in order) holds about the same tokens.

    A share keeps its rows in sampling order: sorted by length, a rank's first mini-batch would get all its short
    responses and the last all its long ones.
    """
    tokens = batch.tensors[ATTENTION_MASK].sum(-1).tolist()
    return batch.select(balanced_order(tokens, world_size, sort_shares=False))


def sampled_mask(batch: Batch) -> torch.Tensor:
    """[B, T] 1 on every generated token, also of rows the truncation policy took out of the loss mask.

    Responses are right-padded, so a row's tokens are its first `response_length` positions.
    """
    width = batch.tensors[RESPONSE_MASK].shape[1]
    lengths = batch.tensors[RESPONSE_LENGTH].to(torch.long)
    positions = torch.arange(width, device=lengths.device)
    return (positions[None, :] < lengths[:, None]).to(batch.tensors[RESPONSE_MASK].dtype)


def add_advantages(batch: Batch, algorithm: AlgorithmConfig) -> Batch:
    """Per-token `advantages` (and `returns`) from the estimator the config names (GRPO by default).

    The score sits on the last generated token of every row, masked or not, so a response that `truncated: mask`
    removed from the loss still counts in its group's mean and std (the paper's Adv-Mask-After); the advantages
    are then spread over the loss mask only, which gives that response none.
    """
    mask = batch.tensors[RESPONSE_MASK]
    token_rewards = scores_to_token_rewards(batch.tensors[REWARDS], sampled_mask(batch))
    kl = algorithm.kl
    if (
        kl.enabled and kl.in_reward
    ):  # KL-in-reward: the penalty lowers every token's reward instead of a loss term
        penalty = kl_penalty(batch.tensors[OLD_LOG_PROBS], batch.tensors[REF_LOG_PROBS], kl.kind)
        token_rewards = token_rewards - kl.coef * penalty * mask
    inputs = AdvantageInputs(token_rewards, mask, batch.non_tensor[UID], batch.tensors.get(VALUES))
    advantages, returns = compute_advantages(
        algorithm.advantage, inputs, AdvantageParams.from_config(algorithm)
    )
    return batch.union(Batch({ADVANTAGES: advantages, RETURNS: returns}))


def rollout_correction(batch: Batch, algorithm: AlgorithmConfig) -> tuple[Batch, dict[str, float]]:
    """The importance weights (`rollout_is_weights`) and the loss mask after rejection, from the old log-probs and
    the sampler's; unchanged when algorithm.rollout_correction is off. Metrics under mismatch/."""
    settings = CorrectionSettings.from_config(algorithm.rollout_correction)
    if not settings.enabled:
        return batch, {}
    weights, mask, metrics = correct(
        batch.tensors[OLD_LOG_PROBS], batch.tensors[ROLLOUT_LOG_PROBS], batch.tensors[RESPONSE_MASK], settings
    )
    tensors = {**batch.tensors, RESPONSE_MASK: mask} | ({IS_WEIGHTS: weights} if weights is not None else {})
    return Batch(tensors, batch.non_tensor, batch.meta), {f"mismatch/{k}": v for k, v in metrics.items()}


def sampler_mismatch(batch: Batch, algorithm: AlgorithmConfig, loss_mask: torch.Tensor) -> dict[str, float]:
    """How far the sampler's log-probs are from the actor's old ones on the tokens of `loss_mask`, overall and per
    ability (mismatch/<metric>, mismatch/<ability>/<metric>); the threshold is rollout_correction.is_cap.

    Pass the loss mask from before rollout-correction rejection: the rejected tokens are the worst of the gap.
    """
    groups = [str(a) for a in batch.non_tensor[ABILITY]] if ABILITY in batch.non_tensor else None
    metrics = mismatch_metrics(
        batch.tensors[OLD_LOG_PROBS],
        batch.tensors[ROLLOUT_LOG_PROBS],
        loss_mask,
        algorithm.rollout_correction.is_cap,
        groups,
    )
    return {f"mismatch/{k}": v for k, v in metrics.items()}


def sampled_entropy(batch: Batch) -> float:
    """MAGIC's entropy estimate e_k: mean negative log-prob of the sampled (loss) tokens of the step's batch."""
    return entropy_estimate(batch.tensors[OLD_LOG_PROBS], batch.tensors[RESPONSE_MASK])


def rollout_entropy(batch: Batch) -> float:
    """e_k from the sampler's own log-probs of the loss tokens (the same weights as the actor's)."""
    return entropy_estimate(batch.tensors[ROLLOUT_LOG_PROBS], batch.tensors[RESPONSE_MASK])


def fuses_old_log_prob(cfg: RunConfig, entropy: AdaptiveEntropyController) -> bool:
    """Whether this step's update takes its old log-probs from its own forward (actor.old_log_prob auto).

    Needs one optimizer step per batch, no KL in the reward and no rollout-correction rejection (both read the old
    log-probs before the update: rejection changes the loss's token count, which the update's micro-batches need
    first; truncated importance weights the update computes itself, row by row) and the
    step's entropy weight before the update: exact unless it depends on e_k (`alpha_needs_estimate`), where the
    switch reads the sampler's log-probs, but only when those are of the training distribution (top_p 1; vLLM's
    are of the unscaled logits, so also temperature 1) and of the weights being trained (rollout.max_staleness 0:
    an asynchronous batch was sampled with weights up to k updates older, whose entropy is not this step's e_k).
    """
    actor, rollout, kl = cfg.actor, cfg.rollout, cfg.algorithm.kl
    one_step = actor.ppo_epochs == 1 and cfg.trainer.batch_size // actor.ppo_mini_batch_size <= 1
    if actor.old_log_prob != "auto" or not one_step or (kl.enabled and kl.in_reward):
        return False
    if cfg.algorithm.rollout_correction.rejection != "off":
        return False
    sampler_matches = (
        rollout.max_staleness == 0
        and rollout.top_p == 1.0
        and (rollout.engine == "hf" or rollout.temperature == 1.0)
    )
    return sampler_matches or not entropy.alpha_needs_estimate


def rollout_metrics(batch: Batch, rejection: RejectionStats) -> dict[str, float]:
    """What the sampled batch looked like, before rejection: rewards, lengths, truncation, group outcomes."""
    lengths = batch.tensors[RESPONSE_LENGTH].float()
    return {
        REWARD_MEAN: float(batch.tensors[REWARDS].float().mean()),
        "reward/score_mean": float(batch.tensors[SCORES].float().mean()),
        SOLVE_ALL_FRAC: rejection.solve_all_frac,
        SOLVE_NONE_FRAC: rejection.solve_none_frac,
        SAMPLED: float(rejection.num_responses),
        "batch/kept": float(rejection.kept_responses),
        REJECTED_FRAC: rejection.dropped_frac,
        "batch/kept_groups": float(rejection.kept_groups),
        LENGTH_MEAN: float(lengths.mean()),
        LENGTH_MAX: float(lengths.max()),
        TRUNCATED_FRAC: float(batch.tensors[TRUNCATED].float().mean()),
        RESPONSE_TOKENS: float(lengths.sum()),
        **ability_metrics(batch),
        **scoring_metrics(batch),
    }


def scoring_metrics(batch: Batch) -> dict[str, float | str]:
    """Where and how long the rows were scored: rows per node (`reward/rows_node_<node>`), the slowest row's
    seconds and the slowest rows as `<seconds>s <ability> <reason>` (under time/ and perf/: they vary run to run)."""
    out: dict[str, float | str] = {}
    if SCORE_NODE in batch.non_tensor:
        nodes, counts = np.unique(np.asarray(batch.non_tensor[SCORE_NODE], dtype=str), return_counts=True)
        out.update({f"reward/rows_node_{n}": float(c) for n, c in zip(nodes, counts, strict=True)})
    if SCORE_SECONDS in batch.non_tensor and len(batch):
        seconds = [float(s) for s in batch.non_tensor[SCORE_SECONDS]]
        slowest = slowest_rows(seconds)
        out[SLOWEST_ROW_SECONDS] = max(seconds)
        nt = batch.non_tensor
        out["perf/reward_slowest_rows"] = "; ".join(
            f"{seconds[i]:.1f}s {nt[ABILITY][i] if ABILITY in nt else '?'} "
            f"{nt[SCORE_REASON][i] if SCORE_REASON in nt else '?'}"
            for i in slowest
        )
    return out


def ability_metrics(batch: Batch) -> dict[str, float]:
    """The sampled batch split by ability (`math/...`, `code/...`) when it holds more than one: responses, reward,
    solve rate, length, truncation and each verifier reason's share (code: wrong output, runtime error, timeout, ...)."""
    if ABILITY not in batch.non_tensor:
        return {}
    abilities = np.asarray(batch.non_tensor[ABILITY], dtype=str)
    kinds = np.unique(abilities)
    if len(kinds) < 2:
        return {}
    reasons = np.asarray(batch.non_tensor[SCORE_REASON], dtype=str)
    out: dict[str, float] = {}
    for kind in kinds:
        rows = abilities == kind
        pick = torch.from_numpy(rows)
        scores = batch.tensors[SCORES][pick].float()
        out[f"{kind}/responses"] = float(rows.sum())
        out[ability_reward_mean(kind)] = float(batch.tensors[REWARDS][pick].float().mean())
        out[f"{kind}/solve_frac"] = float((scores >= 1.0).float().mean())
        out[f"{kind}/length_mean"] = float(batch.tensors[RESPONSE_LENGTH][pick].float().mean())
        out[f"{kind}/truncated_frac"] = float(batch.tensors[TRUNCATED][pick].float().mean())
        names, counts = np.unique(reasons[rows], return_counts=True)
        out.update({f"{kind}/reason_{r}": float(c) / rows.sum() for r, c in zip(names, counts, strict=True)})
    return out


def kept_metrics(batch: Batch) -> dict[str, float]:
    """Statistics of the rows that train: full-vocabulary entropy (when the old-log-prob pass ran) and the advantage
    spread."""
    mask = batch.tensors[RESPONSE_MASK].float()
    tokens = mask.sum().clamp(min=1.0)
    adv = batch.tensors[ADVANTAGES]
    out = {
        "actor/advantage_abs_mean": float((adv.abs() * mask).sum() / tokens),
        "batch/train_tokens": float(mask.sum()),
    }
    if ENTROPY in batch:
        out[ENTROPY_METRIC] = float((batch.tensors[ENTROPY] * mask).sum() / tokens)
    return out


def reason_counts(batch: Batch) -> dict[str, float]:
    """Fraction of responses per verifier reason (correct, wrong_answer, no_answer, timeout, ...)."""
    reasons, counts = np.unique(np.asarray(batch.non_tensor[SCORE_REASON], dtype=str), return_counts=True)
    return {f"reward/reason_{r}": float(c) / len(batch) for r, c in zip(reasons, counts, strict=True)}


def step_metrics(
    sampled: Batch,
    rejection: RejectionStats,
    trained: Batch,
    update: dict[str, float],
    entropy_control: dict[str, float],
    timings: dict[str, float],
) -> dict[str, float]:
    """The step's log record: rollout, verifier reasons, trained rows, actor update, entropy control, time."""
    out = {**rollout_metrics(sampled, rejection), **reason_counts(sampled), **kept_metrics(trained)}
    # the entropy of the weights before the step: the old-log-prob pass's, or the fused update's (the same then)
    out.update({f"actor/{k}": v for k, v in update.items() if k != "entropy" or ENTROPY_METRIC not in out})
    out.update({f"entropy/{k}": v for k, v in entropy_control.items()})
    out.update(timings)
    out[TOKENS_PER_S] = out[RESPONSE_TOKENS] / max(timings.get(STEP_SECONDS, 0.0), 1e-9)
    return out
