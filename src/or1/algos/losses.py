"""Token-level RL losses: PPO-clip with clip-higher and dual clip, loss aggregation, entropy and KL terms.

Pure torch, no models: the training engine runs the forward pass, turns logits into log-probs (and entropy when the
entropy bonus is on) with the helpers here, and calls `policy_loss` once per micro-batch. Every tensor is [B, T] over
response tokens; `mask` is 1 for a response token that counts in the loss and 0 for padding (or masked responses).
Masked positions are selected away with `torch.where`, never multiplied by 0, so whatever sits there (a NaN
log-prob of a padding token, an inf advantage) reaches neither the loss nor its gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from or1.config.schema import RunConfig

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
KLKind = Literal["k1", "k2", "k3"]

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
_SEQ_MODES = AGG_MODES[1:]
# Bounds on log-ratios before exp(): a ratio of e^20 already means the sample is useless; this keeps it finite.
_LOG_RATIO_CLAMP = 20.0
# Upper bound on the k3 KL per token, so one wild token cannot dominate the loss.
_K3_MAX = 10.0
# Elements of one [B, chunk, V] float32 slice processed at once (256 MiB): bounds the temporary vocab-sized buffers.
_MAX_CHUNK_ELEMENTS = 2**26


def masked(values: Tensor, mask: Tensor) -> Tensor:
    """`values` where `mask` is set and 0 elsewhere, by selection: a NaN or inf at a masked position stays out."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def loss_denominators(mask: Tensor) -> tuple[float, float]:
    """(number of loss tokens, number of sequences with at least one loss token) of `mask`.

    Sum these over every micro-batch and data-parallel rank of one optimizer step and pass them to `aggregate` as
    `num_tokens` / `num_seqs` so that accumulated micro-batch losses equal the full-batch loss.
    """
    mask = mask.to(torch.float32)
    return float(mask.sum()), float((mask.sum(-1) > 0).sum())


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: AggMode,
    *,
    num_tokens: float | None = None,
    num_seqs: float | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Reduce per-token values [B, T] to a scalar.

    - token-mean: sum of masked values / number of loss tokens (Skywork-OR1, DAPO: long answers weigh more).
    - seq-mean-token-mean: mean over tokens within each sequence, then sum over sequences / number of sequences.
    - seq-mean-token-sum: sum over tokens within each sequence, then sum over sequences / number of sequences.
    - seq-mean-token-sum-norm (Dr. GRPO): sum over tokens within each sequence divided by the constant
      `norm_length` (the response budget, max_response_length; the padded width T when None), then the mean over
      sequences. verl's mode of that name divides the micro-batch's sum of sequence sums by the constant without
      the mean over sequences, so its loss is this one times the micro-batch size: same direction, another scale.

    `num_tokens` / `num_seqs` replace the local counts by the counts of the whole optimizer step (all micro-batches
    of all ranks, see `loss_denominators`); the micro-batch losses then add up to exactly the full-batch loss. Under
    data-parallel gradient averaging (FSDP / DDP divide by the world size) multiply the loss by the world size, or
    pass the global counts divided by it. Sequences without loss tokens never count in `num_seqs`.
    """
    kept = masked(values, mask)
    mask = mask.to(values.dtype)
    if mode == "token-mean":
        denom = float(mask.sum()) if num_tokens is None else num_tokens
        return kept.sum() / max(denom, 1.0)
    if mode not in _SEQ_MODES:
        raise ValueError(f"unknown loss aggregation mode {mode!r}; expected one of {AGG_MODES}")
    per_seq = kept.sum(-1)
    lengths = mask.sum(-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / lengths.clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / float(values.shape[-1] if norm_length is None else norm_length)
    denom = float((lengths > 0).sum()) if num_seqs is None else num_seqs
    return per_seq.sum() / max(denom, 1.0)


def masked_mean(values: Tensor, mask: Tensor) -> float:
    """Plain masked mean for metrics (local to this micro-batch)."""
    return float(masked(values, mask).sum() / mask.to(values.dtype).sum().clamp(min=1.0))


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
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate with separate lower / upper epsilon (clip-higher), and optionally dual clip.

    Per token: L = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high)) with r = exp(log_probs - old_log_probs),
    aggregated by `aggregate(..., agg_mode)`. Dual clip (`clip_ratio_c` = c > 1, verl's default 3.0; None: off):
    where A < 0 the loss is min(L, -A * c), so a token whose ratio ran far above 1 has a bounded loss and no
    gradient; A >= 0 is unchanged. Metrics (local masked means over this micro-batch): clip_frac (tokens whose
    clipped term is the active one), clip_frac_low (A < 0 and r < 1 - clip_low), clip_frac_high (A > 0 and
    r > 1 + clip_high), clip_frac_dual (A < 0 and the dual bound active), approx_kl (k3 estimate of
    KL(old || new)), ratio_mean.
    """
    if clip_ratio_c is not None and clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    log_ratio = masked(log_probs - old_log_probs, mask).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    advantages = masked(advantages, mask)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    dual = torch.zeros_like(token_loss, dtype=torch.bool)
    if clip_ratio_c is not None:
        bound = -advantages * clip_ratio_c
        dual = (advantages < 0) & (bound < token_loss)
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, bound), token_loss)
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": norm_length}
    loss = aggregate(token_loss, mask, agg_mode, **agg)
    with torch.no_grad():
        ratio_d, adv_d = ratio.detach(), advantages.detach()
        metrics = {
            "clip_frac": masked_mean((clipped.detach() > unclipped.detach()).float(), mask),
            "clip_frac_low": masked_mean(((adv_d < 0) & (ratio_d < 1.0 - clip_low)).float(), mask),
            "clip_frac_high": masked_mean(((adv_d > 0) & (ratio_d > 1.0 + clip_high)).float(), mask),
            "approx_kl": masked_mean(ratio_d - 1.0 - log_ratio.detach(), mask),
            "ratio_mean": masked_mean(ratio_d, mask),
        }
        if clip_ratio_c is not None:
            metrics["clip_frac_dual"] = masked_mean(dual.float(), mask)
    return loss, metrics


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
        neg = (-diff).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
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
        chunk = max(1, _MAX_CHUNK_ELEMENTS // max(1, b * v))
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

    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None  # dual-clip bound for negative advantages; None: plain PPO-clip
    agg_mode: AggMode = "token-mean"
    norm_length: float | None = None  # seq-mean-token-sum-norm's constant: the response budget
    kl_coef: float = 0.0  # 0 disables the KL loss term (also when the KL goes into the reward instead)
    kl_kind: KLKind = "k3"

    @classmethod
    def from_config(cls, run_config: RunConfig) -> LossConfig:
        """Build from a resolved RunConfig (actor.clip_ratio_*, actor.loss_agg_mode, algorithm.kl)."""
        kl = run_config.algorithm.kl
        use_kl_loss = kl.enabled and not kl.in_reward
        return cls(
            clip_low=run_config.actor.clip_ratio_low,
            clip_high=run_config.actor.clip_ratio_high,
            clip_ratio_c=run_config.actor.clip_ratio_c,
            agg_mode=run_config.actor.loss_agg_mode,
            norm_length=float(run_config.rollout.max_response_length),
            kl_coef=kl.coef if use_kl_loss else 0.0,
            kl_kind=kl.kind,
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
    num_tokens: float | None = None,
    num_seqs: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The actor's loss for one micro-batch: PPO-clip - entropy_coef * H + kl_coef * KL, all aggregated alike.

    Args:
        log_probs: [B, T] current policy log-probs of the response tokens (with grad), see `token_log_probs`.
        old_log_probs: [B, T] rollout-time log-probs (no grad).
        advantages: [B, T] per-token advantages (GRPO: the sequence advantage broadcast over its tokens).
        mask: [B, T] loss mask.
        cfg: clip bounds, aggregation mode, KL settings.
        entropy: [B, T] full-vocabulary entropy with grad (`entropy_from_logits`); required when entropy_coef > 0.
        entropy_coef: this step's alpha from `AdaptiveEntropyController.step`.
        ref_log_probs: [B, T] reference-model log-probs; required when cfg.kl_coef > 0.
        num_tokens, num_seqs: global denominators of the optimizer step (see `aggregate`); with FSDP / DDP, which
            average gradients over data-parallel ranks, scale the returned loss by the data-parallel size.

    Returns the scalar loss to backpropagate and metrics: pg_loss, entropy_loss and kl_loss (this micro-batch's
    contribution, so they sum to the full-batch value over micro-batches), plus ppo_clip_loss's local means,
    entropy (local mean H) and kl (local mean KL) when computed, and tokens (local loss-token count, for weighting).
    """
    agg = {"num_tokens": num_tokens, "num_seqs": num_seqs, "norm_length": cfg.norm_length}
    pg, metrics = ppo_clip_loss(
        log_probs,
        old_log_probs,
        advantages,
        mask,
        clip_low=cfg.clip_low,
        clip_high=cfg.clip_high,
        clip_ratio_c=cfg.clip_ratio_c,
        agg_mode=cfg.agg_mode,
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
