"""The actor's loss: a policy-gradient term (`policy_losses`, by name), entropy and KL terms; the critic's value loss.

Pure torch, no models: the training engine runs the forward pass, turns logits into log-probs (and entropy when the
entropy bonus is on) with the helpers here, and calls `policy_loss` once per micro-batch. Every tensor is [B, T] over
response tokens; `mask` is 1 for a response token that counts in the loss and 0 for padding (or masked responses);
aggregation and masking are `aggregation`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from or1.algos.aggregation import LOG_RATIO_BOUND, AggMode, aggregate, masked, masked_mean
from or1.algos.policy_losses import POLICY_LOSSES, PolicyLossName
from or1.algos.rollout_correction import CorrectionSettings

if TYPE_CHECKING:
    from or1.config.schema import RunConfig

KLKind = Literal["k1", "k2", "k3"]

# Upper bound on the k3 KL per token, so one wild token cannot dominate the loss.
_K3_MAX = 10.0
# Elements of one [B, chunk, V] float32 slice processed at once (256 MiB): bounds the temporary vocab-sized buffers.
MAX_SLICE_ELEMENTS = 2**26


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: KLKind = "k3") -> Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens [B, T] (Schulman's k1 / k2 / k3).

    k1 = logp - ref; k2 = (logp - ref)^2 / 2; k3 = exp(ref - logp) - (ref - logp) - 1 (non-negative, unbiased, low
    variance), with the log-ratio clamped to +-20 and the result to <= 10 for stability.
    """
    diff = log_probs - ref_log_probs
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind == "k3":
        neg = (-diff).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return (torch.exp(neg) - neg - 1.0).clamp(max=_K3_MAX)
    raise ValueError(f"unknown KL kind {kind!r}; expected k1, k2 or k3")


def _over_time_chunks(
    fn: Callable[..., Tensor], logits: Tensor, *others: Tensor, chunk: int | None
) -> Tensor:
    """Apply fn to [B, t:t+chunk] slices of logits (and others) and concatenate along T.

    Bounds the vocab-sized float32 temporaries; with autograd on, each chunk is checkpointed so the backward pass
    keeps only the (already existing) logits, not a float32 softmax copy per chunk.
    """
    b, t, v = logits.shape
    if chunk is None:
        chunk = max(1, MAX_SLICE_ELEMENTS // max(1, b * v))
    if chunk >= t:
        return fn(logits, *others)
    parts = []
    for start in range(0, t, chunk):
        sl = [x[:, start : start + chunk] for x in (logits, *others)]
        if torch.is_grad_enabled() and logits.requires_grad:
            parts.append(checkpoint(fn, *sl, use_reentrant=False))
        else:
            parts.append(fn(*sl))
    return torch.cat(parts, dim=1)


def token_log_probs(
    logits: Tensor, tokens: Tensor, temperature: float = 1.0, *, chunk: int | None = None
) -> Tensor:
    """Log-probability [B, T] of `tokens` under softmax(logits / temperature), computed in float32.

    The temperature must be the rollout's sampling temperature so that old and new log-probs describe the same
    distribution the responses were drawn from. Uses gather - logsumexp, never a full log_softmax tensor.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")

    def _fn(lg: Tensor, tok: Tensor) -> Tensor:
        z = lg.float() / temperature
        picked = z.gather(-1, tok.unsqueeze(-1).long()).squeeze(-1)
        return picked - torch.logsumexp(z, dim=-1)

    return _over_time_chunks(_fn, logits, tokens, chunk=chunk)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, *, chunk: int | None = None) -> Tensor:
    """Full-vocabulary entropy [B, T] of softmax(logits / temperature), stable and chunked over T.

    H = logsumexp(z) - sum(softmax(z) * z), which never takes the log of a tiny probability.
    """

    def _fn(lg: Tensor) -> Tensor:
        z = lg.float() / temperature
        lse = torch.logsumexp(z, dim=-1)
        # -inf logits (masked vocabulary) have p = 0; a finite floor keeps 0 * z at 0 instead of nan
        z_finite = z.clamp(min=torch.finfo(z.dtype).min)
        return lse - (torch.softmax(z, dim=-1) * z_finite).sum(-1)

    return _over_time_chunks(_fn, logits, chunk=chunk)


@dataclass(frozen=True)
class LossConfig:
    """The static knobs of the actor loss; the entropy coefficient changes per step and is passed per call."""

    policy_loss: PolicyLossName = "ppo"  # the policy-gradient term (policy_losses.POLICY_LOSSES)
    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None  # dual-clip bound for negative advantages; None: plain PPO-clip
    agg_mode: AggMode = "token-mean"
    norm_length: float | None = None  # seq-mean-token-sum-norm's constant: the response budget
    kl_coef: float = 0.0  # 0 disables the KL loss term (also when the KL goes into the reward instead)
    kl_kind: KLKind = "k3"
    # algorithm.rollout_correction: an on-policy update (no old log-probs given) computes its truncated importance
    # weights from its own forward and the sampler's log-probs; a given update gets them as a column
    correction: CorrectionSettings = CorrectionSettings()

    @classmethod
    def from_config(cls, run_config: RunConfig) -> LossConfig:
        """Build from a resolved RunConfig (actor.clip_ratio_*, actor.loss_agg_mode, algorithm.kl)."""
        kl = run_config.algorithm.kl
        use_kl_loss = kl.enabled and not kl.in_reward
        return cls(
            policy_loss=run_config.actor.policy_loss,
            clip_low=run_config.actor.clip_ratio_low,
            clip_high=run_config.actor.clip_ratio_high,
            clip_ratio_c=run_config.actor.clip_ratio_c,
            agg_mode=run_config.actor.loss_agg_mode,
            norm_length=float(run_config.rollout.max_response_length),
            kl_coef=kl.coef if use_kl_loss else 0.0,
            kl_kind=kl.kind,
            correction=CorrectionSettings.from_config(run_config.algorithm.rollout_correction),
        )

    @property
    def needs_ref(self) -> bool:
        """Whether the loss needs reference log-probs (a reference model)."""
        return self.kl_coef > 0


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    cfg: LossConfig,
    *,
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    ref_log_probs: Tensor | None = None,
    is_weights: Tensor | None = None,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss for one micro-batch: PG - entropy_coef * H + kl_coef * KL, all aggregated alike, where PG is
    the policy-gradient term cfg.policy_loss names (PPO-clip by default).

    Args:
        log_probs: [B, T] current policy log-probs of the response tokens (with grad), see `token_log_probs`.
        old_log_probs: [B, T] rollout-time log-probs (no grad).
        advantages: [B, T] per-token advantages (GRPO: the sequence advantage broadcast over its tokens).
        mask: [B, T] loss mask.
        cfg: clip bounds, aggregation mode, KL settings.
        entropy: [B, T] full-vocabulary entropy with grad (`entropy_from_logits`); required when entropy_coef > 0.
        entropy_coef: this step's alpha from `AdaptiveEntropyController.step`.
        ref_log_probs: [B, T] reference-model log-probs; required when cfg.kl_coef > 0.
        is_weights: [B, T] rollout-correction weights (algos/rollout_correction), multiplying the PG term per token.
        num_tokens, num_seqs: global denominators of the optimizer step (see `aggregate`); with FSDP / DDP, which
            average gradients over data-parallel ranks, scale the returned loss by the data-parallel size.

    Returns the scalar loss to backpropagate and metrics: pg_loss, entropy_loss and kl_loss (this micro-batch's
    contribution, so they sum to the full-batch value over micro-batches), plus the PG term's local means,
    entropy (local mean H) and kl (local mean KL) when computed, and tokens (local loss-token count, for weighting).
    """
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": cfg.norm_length}
    pg, metrics = POLICY_LOSSES[cfg.policy_loss](
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        clip_ratio_c=cfg.clip_ratio_c,
        agg_mode=cfg.agg_mode,
        is_weights=is_weights,
        **agg,
    )
    loss = pg
    metrics["pg_loss"] = float(pg.detach())
    metrics["tokens"] = float(mask.sum())
    if entropy is not None:
        entropy = masked(entropy, mask)
        ent = aggregate(entropy, mask, cfg.agg_mode, **agg)
        metrics["entropy"] = masked_mean(entropy.detach(), mask)
        metrics["entropy_loss"] = float(ent.detach())
        if entropy_coef != 0.0:
            loss = loss - entropy_coef * ent
    elif entropy_coef != 0.0:
        raise ValueError("entropy_coef is non-zero but no entropy tensor was given")
    if cfg.kl_coef > 0:
        if ref_log_probs is None:
            raise ValueError("the KL loss is on (kl_coef > 0) but no ref_log_probs were given")
        kl = kl_penalty(masked(log_probs, mask), masked(ref_log_probs, mask), cfg.kl_kind)
        kl_agg = aggregate(kl, mask, cfg.agg_mode, **agg)
        loss = loss + cfg.kl_coef * kl_agg
        metrics["kl"] = masked_mean(kl.detach(), mask)
        metrics["kl_loss"] = float(kl_agg.detach())
    return loss, metrics


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    cliprange: float,
    num_tokens: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The critic's clipped value loss for one micro-batch (PPO), token-mean aggregated.

    Per token: 0.5 * max((V - G)^2, (V_clip - G)^2) with V_clip = V_old + clip(V - V_old, -cliprange, cliprange),
    V the current values (with grad), V_old the values the advantages were computed from and G the GAE returns.
    Returns the loss and metrics: vf_loss (this micro-batch's contribution, see `aggregate`), vf_clip_frac (tokens
    whose clipped term is the larger), value_mean and return_mean (local masked means), tokens.
    """
    values, old_values, returns = (masked(t, mask) for t in (values, old_values, returns))
    clipped = old_values + (values - old_values).clamp(-cliprange, cliprange)
    unclipped_sq, clipped_sq = (values - returns).square(), (clipped - returns).square()
    loss = aggregate(0.5 * torch.maximum(unclipped_sq, clipped_sq), mask, "token-mean", num_tokens=num_tokens)
    metrics = {
        "vf_loss": float(loss.detach()),
        "vf_clip_frac": masked_mean((clipped_sq > unclipped_sq).float().detach(), mask),
        "value_mean": masked_mean(values.detach(), mask),
        "return_mean": masked_mean(returns, mask),
        "tokens": float(mask.sum()),
    }
    return loss, metrics
