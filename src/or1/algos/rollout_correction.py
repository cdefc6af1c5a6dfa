"""When the sampler and the trainer disagree: how far apart they are, and the importance-sampling correction.

The rollout engine samples from pi_sampler (vLLM in bfloat16 with its own kernels on a GPU) while PPO's ratio is
taken against pi_old, the actor's own log-probs of the same tokens (float32 master weights). Per loss token
rho_t = pi_old(y_t) / pi_sampler(y_t) says how much more the trainer likes a token than the sampler did.

- `mismatch_sums` / `mismatch_metrics`: the gap, per token: mean and max of |log pi_old - log pi_sampler|, a k3
  estimate of KL(pi_sampler || pi_old) (the tokens were drawn from the sampler), and the share of tokens whose rho
  lies outside [1 / cap, cap] (`threshold`). Measured on every loss token before rejection, unbounded.
- `correct`: verl's "decoupled" rollout correction, with its definitions (docs/algo/rollout_corr.md there):
  importance weights truncated at a cap (TIS: token level, w_t = min(rho_t, cap); sequence level, w = min(prod_t
  rho_t, cap) on every token of the response) and rejection (MIS: a token, or a whole response, leaves the loss
  mask when its ratio is outside [lower, upper]; per response either the product of its token ratios or their
  geometric mean exp(mean_t log rho_t)). Log-ratios are bounded to +-20 before exp() in the weights, padding gets
  weight 0.

The diagnostic metrics never bound the log-ratio: a broken weights push must read as one, not as a gap of 20. They
take it in float64, whose exp() stays finite to |log rho| ~ 700.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from or1.algos.aggregation import LOG_RATIO_BOUND, masked

ISLevel = Literal["off", "token", "sequence"]
RejectionLevel = Literal["off", "token", "sequence", "geometric"]


@dataclass(frozen=True)
class CorrectionSettings:
    """algorithm.rollout_correction, as the pure functions here read it."""

    is_level: ISLevel = "off"
    is_cap: float = 2.0
    rejection: RejectionLevel = "off"
    rejection_upper: float = 2.0
    rejection_lower: float | None = None  # None: 1 / rejection_upper

    @property
    def enabled(self) -> bool:
        return self.is_level != "off" or self.rejection != "off"

    @property
    def lower(self) -> float:
        return 1.0 / self.rejection_upper if self.rejection_lower is None else self.rejection_lower

    @classmethod
    def from_config(cls, c) -> CorrectionSettings:
        """From algorithm.rollout_correction (config.schema.RolloutCorrectionConfig)."""
        return cls(c.is_level, c.is_cap, c.rejection, c.rejection_upper, c.rejection_lower)


def log_ratio(old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> Tensor:
    """log rho = log pi_old - log pi_sampler per token [B, T], 0 outside the mask."""
    return masked(old_log_probs.float() - rollout_log_probs.float(), mask)


def sequence_log_ratio(token_log_ratio: Tensor, mask: Tensor, *, geometric: bool) -> Tensor:
    """Per response [B]: log of the product of its token ratios, or (geometric) of their geometric mean."""
    total = token_log_ratio.sum(-1)
    if not geometric:
        return total
    return total / mask.to(total.dtype).sum(-1).clamp(min=1.0)


def correct(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, settings: CorrectionSettings
) -> tuple[Tensor | None, Tensor, dict[str, float]]:
    """(importance weights [B, T] or None when off, the loss mask after rejection, metrics).

    Metrics, with IS on: is_ratio_mean / is_ratio_max, the ratio before truncation (rho_t; at sequence level the
    response's prod_t rho_t on each of its tokens), unbounded, over every loss token before rejection;
    is_weight_mean / is_weight_max, the truncated weights that multiply the loss, over the loss tokens rejection
    kept; is_truncated_frac, the share of those whose ratio hit the cap. With rejection on: rejected_token_frac
    (rejected loss tokens / loss tokens) and rejected_seq_frac (responses that lost at least one loss token /
    responses with loss tokens; at sequence level a response loses all of them or none).
    """
    mask_b = mask.bool()
    lr = log_ratio(old_log_probs, rollout_log_probs, mask)
    keep = mask_b.clone()
    metrics: dict[str, float] = {}
    if settings.rejection != "off":
        lo, hi = torch.log(torch.tensor(settings.lower)), torch.log(torch.tensor(settings.rejection_upper))
        if settings.rejection == "token":
            keep &= (lr >= lo) & (lr <= hi)
        else:
            seq = sequence_log_ratio(lr, mask, geometric=settings.rejection == "geometric")
            keep &= ((seq >= lo) & (seq <= hi))[:, None]
        rejected = mask_b & ~keep
        tokens, rows = mask_b.sum().clamp(min=1), mask_b.any(-1)
        metrics["rejected_token_frac"] = float(rejected.sum() / tokens)
        metrics["rejected_seq_frac"] = float(rejected.any(-1).sum() / rows.sum().clamp(min=1))
    weights = None
    if settings.is_level != "off":
        metrics.update(_ratio_metrics(lr, mask_b, settings.is_level))
        raw = torch.exp(_bounded_weight_log(lr, mask, settings.is_level))
        weights = masked(raw.clamp(max=settings.is_cap), keep)
        kept = keep.sum().clamp(min=1)
        metrics["is_weight_mean"] = float(weights.sum() / kept)
        metrics["is_weight_max"] = float(weights.max()) if keep.any() else 0.0
        metrics["is_truncated_frac"] = float(((raw > settings.is_cap) & keep).sum() / kept)
    return weights, keep.to(mask.dtype), metrics


def importance_weights(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, settings: CorrectionSettings
) -> Tensor:
    """TIS's truncated weights [B, T] alone, as `correct` gives them without rejection: what an on-policy update
    computes from its own forward (rows whole, so a sequence's product stays within its micro-batch)."""
    lr = log_ratio(old_log_probs, rollout_log_probs, mask)
    return masked(
        torch.exp(_bounded_weight_log(lr, mask, settings.is_level)).clamp(max=settings.is_cap), mask
    )


def _bounded_weight_log(token_log_ratio: Tensor, mask: Tensor, level: ISLevel) -> Tensor:
    """Each token's log-weight before truncation, bounded to +-LOG_RATIO_BOUND: its own log rho_t (token level)
    or its response's sum (sequence level)."""
    if level == "token":
        return token_log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq = sequence_log_ratio(token_log_ratio, mask, geometric=False).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return seq[:, None].expand_as(token_log_ratio)


def _ratio_metrics(token_log_ratio: Tensor, mask: Tensor, level: ISLevel) -> dict[str, float]:
    """Mean and max of the untruncated, unbounded ratio over the loss tokens of `mask` (float64)."""
    lr = token_log_ratio.double()
    if level == "sequence":
        lr = sequence_log_ratio(lr, mask, geometric=False)[:, None].expand_as(lr)
    ratio = masked(torch.exp(lr), mask)
    return {
        "is_ratio_mean": float(ratio.sum() / mask.sum().clamp(min=1)),
        "is_ratio_max": float(ratio.max()) if mask.any() else 0.0,
    }


@dataclass
class MismatchSums:
    """Statistics of the sampler / trainer gap over some tokens; `metrics` turns them into means."""

    tokens: float = 0.0
    abs_diff: float = 0.0
    abs_diff_max: float = 0.0
    k3: float = 0.0
    past_threshold: float = 0.0

    def metrics(self) -> dict[str, float]:
        n = max(self.tokens, 1.0)
        return {
            "abs_diff_mean": self.abs_diff / n,
            "abs_diff_max": self.abs_diff_max,
            "k3_kl": self.k3 / n,
            "past_threshold_frac": self.past_threshold / n,
        }


def mismatch_sums(
    old_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor, threshold: float
) -> MismatchSums:
    """The gap on the tokens of `mask`: |log rho|, k3 = rho - 1 - log rho (estimates KL(sampler || old) from the
    sampler's tokens) and the count of tokens with rho outside [1 / threshold, threshold]; log rho unbounded."""
    mask_b = mask.bool()
    lr = log_ratio(old_log_probs, rollout_log_probs, mask).double()
    diff = lr.abs()
    k3 = masked(torch.exp(lr) - 1.0 - lr, mask_b)
    return MismatchSums(
        tokens=float(mask_b.sum()),
        abs_diff=float(masked(diff, mask_b).sum()),
        abs_diff_max=float(masked(diff, mask_b).max()) if mask_b.any() else 0.0,
        k3=float(k3.sum()),
        past_threshold=float((mask_b & (diff > torch.log(torch.tensor(threshold)))).sum()),
    )


def mismatch_metrics(
    old_log_probs: Tensor,
    rollout_log_probs: Tensor,
    mask: Tensor,
    threshold: float,
    groups: list[str] | None = None,
) -> dict[str, float]:
    """`MismatchSums.metrics` over all loss tokens, and per group (one label per row, e.g. the ability) as
    `<group>/<metric>` when labels are given."""
    out = mismatch_sums(old_log_probs, rollout_log_probs, mask, threshold).metrics()
    if groups is not None:
        for label in sorted(set(groups)):
            rows = torch.tensor([g == label for g in groups], dtype=torch.bool)
            sums = mismatch_sums(old_log_probs[rows], rollout_log_probs[rows], mask[rows], threshold)
            out.update({f"{label}/{k}": v for k, v in sums.metrics().items()})
    return out
