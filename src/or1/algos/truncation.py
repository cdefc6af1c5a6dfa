"""What a truncated response (one that hit the response-length budget) contributes to training.

- zero_reward (Skywork-OR1's default, "no advantage mask"): its reward is 0, so it gets a negative advantage in a
  group that solved the problem at least once; the loss mask is unchanged.
- mask (the paper's "Adv-Mask-After" ablation): it still counts in its group's reward mean / std, but its tokens
  are removed from the loss (loss-mask row zeroed), so it neither helps nor hurts. The paper found this raised the
  truncation rate with no gain at 32K.

Beside them, DAPO's overlong reward shaping (`overlong_penalty`, algorithm.overlong): a soft length penalty over the
last `buffer` tokens of the budget, added to the reward whatever the truncation policy.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

TruncationPolicy = Literal["zero_reward", "mask"]


def apply_truncation_policy(
    rewards: Tensor, truncated: Tensor, mask: Tensor, policy: TruncationPolicy
) -> tuple[Tensor, Tensor]:
    """Return (rewards [B], loss_mask [B, T]) after applying `policy` (AlgorithmConfig.truncated).

    `truncated` [B] is True for responses cut at max_response_length. Inputs are not modified.
    """
    trunc = truncated.to(device=rewards.device, dtype=torch.bool)
    if trunc.shape != rewards.shape or mask.shape[0] != rewards.shape[0]:
        raise ValueError(
            f"shapes disagree: rewards {tuple(rewards.shape)}, truncated {tuple(trunc.shape)}, mask {tuple(mask.shape)}"
        )
    if policy == "zero_reward":
        return torch.where(trunc, torch.zeros_like(rewards), rewards), mask.clone()
    if policy == "mask":
        keep = (~trunc).to(mask.dtype).unsqueeze(-1)
        return rewards.clone(), mask * keep
    raise ValueError(f"unknown truncation policy {policy!r}; expected zero_reward or mask")


def overlong_penalty(lengths: Tensor, budget: int, buffer: int, penalty: float) -> Tensor:
    """DAPO's soft overlong punishment [B], to add to the rewards (0 when buffer is 0).

    With L_max the response budget and L_cache the buffer: 0 for |y| <= L_max - L_cache, then falling linearly,
    ((L_max - L_cache) - |y|) / L_cache * penalty, to -penalty at |y| = L_max (a truncated response).
    """
    if buffer <= 0:
        return torch.zeros(lengths.shape, dtype=torch.float32, device=lengths.device)
    if buffer > budget:
        raise ValueError(f"the overlong buffer ({buffer} tokens) exceeds the response budget ({budget})")
    expected = budget - buffer
    excess = (lengths.to(torch.float32) - expected).clamp(min=0.0)
    return -(excess / buffer).clamp(max=1.0) * penalty
