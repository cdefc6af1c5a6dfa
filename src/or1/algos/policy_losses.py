"""The policy-gradient terms the actor can train with, by name (`actor.policy_loss`): PPO-clip, GSPO and CISPO.

Every function takes per-token tensors [B, T] (current log-probs with grad, old log-probs, advantages, the loss
mask), the clip bounds (`clip_low`, `clip_high`), the aggregation (`agg_mode` and the step's global denominators, see
`aggregation.aggregate`) and optional detached rollout-correction weights (`is_weights`, see
`rollout_correction`), which multiply each token's loss. Each returns the loss to backpropagate and local metrics.

- ppo (Skywork-OR1, verl): per-token ratio r = pi / pi_old, clipped surrogate, clip-higher and dual clip.
- gspo (Zheng et al. 2025, "Group Sequence Policy Optimization"): one ratio per response, the geometric mean
  s = exp(mean_t log(pi / pi_old)), clipped like PPO's (the paper's bounds are ~3e-4 / 4e-4); written per token as
  s_t = sg(s) * pi_t / sg(pi_t), whose gradient under seq-mean-token-mean aggregation is the sequence objective's
  (the config refuses gspo with any other actor.loss_agg_mode).
- cispo (MiniMax-M1, 2025): REINFORCE with a clipped, detached importance weight: loss -sg(clip(r)) * A * log pi, so
  no token's gradient is ever dropped (PPO's clip zeroes it), only its weight bounded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from or1.algos.aggregation import LOG_RATIO_BOUND, AggMode, aggregate, masked, masked_mean

PolicyLossName = Literal["ppo", "gspo", "cispo"]
PolicyLossFn = Callable[..., tuple[Tensor, dict[str, float]]]


def _weighted(token_loss: Tensor, is_weights: Tensor | None, mask: Tensor) -> Tensor:
    """Token losses times the rollout-correction weights (detached), where there are any."""
    if is_weights is None:
        return token_loss
    return token_loss * masked(is_weights.detach().to(token_loss.dtype), mask)


def _clipped_surrogate(
    advantages: Tensor, ratio: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's per-token max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)), and where the clipped term is the
    larger one (detached, for clip_frac)."""
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped.detach() > unclipped.detach()


def ppo_clip_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg_mode: AggMode = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate lower / upper epsilon (clip-higher), and optionally dual clip.

    Per token: L = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)) with r = exp(log_probs - old_log_probs),
    aggregated by `aggregate(..., agg_mode)`. Dual clip (`clip_ratio_c` = c > 1, verl's default 3.0; None: off):
    where A < 0 the loss is min(L, -A * c), so a token whose ratio ran far above 1 has a bounded loss and no
    gradient; A >= 0 is unchanged. Metrics (local masked means over this micro-batch): clip_frac (tokens whose
    clipped term is the active one), clip_frac_low (A < 0 and r < 1 - clip_low), clip_frac_high (A > 0 and
    r > 1 + clip_high), clip_frac_dual (A < 0 and the dual bound active), approx_kl (k3 estimate of
    KL(old || new)), ratio_mean. `is_weights` [B, T] (detached rollout-correction weights) multiply each token's
    clipped loss, as in verl's decoupled rollout correction.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = masked(log_probs - old_log_probs, mask).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    advantages = masked(advantages, mask)
    ratio = torch.exp(log_ratio)
    token_loss, clip_active = _clipped_surrogate(advantages, ratio, clip_low, clip_high)
    dual = torch.zeros_like(token_loss, dtype=torch.bool)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        dual = (advantages < 0) & (bound < token_loss)
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, bound), token_loss)
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
    loss = aggregate(_weighted(token_loss, is_weights, mask), mask, agg_mode, **agg)
    with torch.no_grad():
        ratio_d, adv_d = ratio.detach(), advantages.detach()
        metrics = {
            "clip_frac": masked_mean(clip_active.float(), mask),
            "clip_frac_low": masked_mean(((adv_d < 0) & (ratio_d < 1.0 - clip_low)).float(), mask),
            "clip_frac_high": masked_mean(((adv_d > 0) & (ratio_d > 1.0 + clip_high)).float(), mask),
            "approx_kl": masked_mean(ratio_d - 1.0 - log_ratio.detach(), mask),
            "ratio_mean": masked_mean(ratio_d, mask),
        }
        if clip_ratio_c is not None:
            metrics["clip_frac_dual"] = masked_mean(dual.float(), mask)
    return loss, metrics


def gspo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg_mode: AggMode = "seq-mean-token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO: the clipped surrogate on each response's length-normalised sequence ratio (dual clip does not apply).

    s_i = exp(sum_t m_t (log pi_t - log pi_old,t) / sum_t m_t); per token s_it = sg(s_i) * exp(log pi_t - sg(log
    pi_t)) has the value s_i and the gradient s_i * grad log pi_t, and L_it = max(-A s_it, -A clip(s_it, 1 - clip_low,
    1 + clip_high)). With seq-mean-token-mean (the paper's 1/G sum_i 1/|y_i| sum_t) that is exactly the sequence-level
    objective. Metrics: clip_frac (share of loss tokens whose response is clipped), ratio_mean (token-weighted mean
    of s), approx_kl (k3 of the per-token ratios).
    """
    del clip_ratio_c  # a sequence ratio has no dual clip
    log_ratio = masked(log_probs - old_log_probs, mask)
    lengths = mask.to(log_ratio.dtype).sum(-1).clamp(min=1.0)
    seq_log_ratio = (log_ratio.detach().sum(-1) / lengths).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    token_log_ratio = masked(log_probs - log_probs.detach(), mask) + seq_log_ratio[:, None]
    ratio = torch.exp(token_log_ratio)
    advantages = masked(advantages, mask)
    token_loss, clip_active = _clipped_surrogate(advantages, ratio, clip_low, clip_high)
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
    loss = aggregate(_weighted(token_loss, is_weights, mask), mask, agg_mode, **agg)
    with torch.no_grad():
        token_ratio = torch.exp(log_ratio.detach().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))
        metrics = {
            "clip_frac": masked_mean(clip_active.float(), mask),
            "approx_kl": masked_mean(token_ratio - 1.0 - log_ratio.detach(), mask),
            "ratio_mean": masked_mean(ratio.detach(), mask),
        }
    return loss, metrics


def cispo_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None = None,
    agg_mode: AggMode = "token-mean",
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
    is_weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO: L_t = -sg(clip(r_t, 1 - clip_low, 1 + clip_high)) * A_t * log pi_t (dual clip does not apply).

    The gradient of every loss token survives, scaled by its clipped ratio (the paper sets no lower bound in effect:
    clip_low 1.0 gives 0). Metrics: clip_frac (tokens whose weight was clipped, either side), ratio_mean,
    approx_kl.
    """
    del clip_ratio_c
    log_ratio = masked(log_probs - old_log_probs, mask).detach().clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    token_loss = -masked(advantages, mask) * weight * masked(log_probs, mask)
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
    loss = aggregate(_weighted(token_loss, is_weights, mask), mask, agg_mode, **agg)
    metrics = {
        "clip_frac": masked_mean((weight != ratio).float(), mask),
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
        "ratio_mean": masked_mean(ratio, mask),
    }
    return loss, metrics


POLICY_LOSSES: dict[str, PolicyLossFn] = {"ppo": ppo_clip_loss, "gspo": gspo_loss, "cispo": cispo_loss}
