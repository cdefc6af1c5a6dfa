"""How per-token values [B, T] become one loss: the aggregation modes, masked selection and the loss denominators.

Masked positions are selected away with `torch.where`, never multiplied by 0, so whatever sits there (a NaN
log-prob of a padding token, an inf advantage) reaches neither the loss nor its gradient.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

AggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
_SEQ_MODES = AGG_MODES[1:]
# Bound on log-ratios before exp(): a ratio of e^20 already means the sample is useless; this keeps it finite.
LOG_RATIO_BOUND = 20.0


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
