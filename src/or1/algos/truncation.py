"""What a truncated response (one that hit the response-length budget) contributes to training.

- zero_reward (Skywork-OR1's default, "no advantage mask"): its reward is 0, so it gets a negative advantage in a
  group that solved the problem at least once; the loss mask is unchanged.
- mask (the paper's "Adv-Mask-After" ablation): it still counts in its group's reward mean / std, but its tokens
  are removed from the loss (loss-mask row zeroed), so it neither helps nor hurts. The paper found this raised the
  truncation rate with no gain at 32K.
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
