"""Advantage estimators: GRPO (default), RLOO and GAE, plus a registry the controller picks from by name.

Outcome estimators (GRPO, RLOO) turn one score per response into one advantage per response, which
`broadcast_to_tokens` spreads over its response tokens. GAE works on token rewards and critic values.
`compute_advantages` gives all three one calling convention for the controller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

if TYPE_CHECKING:
    from or1.config.schema import AlgorithmConfig


def group_index(group_ids: Sequence | np.ndarray | torch.Tensor) -> tuple[np.ndarray, int]:
    """Map hashable group ids (prompt uids, ints) to dense indices 0..G-1 in order of first appearance.

    Returns (index per item, G).
    """
    if isinstance(group_ids, torch.Tensor):  # 0-d tensors hash by identity: compare values instead
        group_ids = group_ids.tolist()
    order: dict = {}
    idx = np.fromiter(
        (order.setdefault(g, len(order)) for g in group_ids), dtype=np.int64, count=len(group_ids)
    )
    return idx, len(order)


def _group_sums(rewards: Tensor, group_ids: Sequence | np.ndarray) -> tuple[Tensor, Tensor, Tensor]:
    """(dense group index per item, per-group reward sum, per-group count), all as tensors on rewards' device."""
    if rewards.dim() != 1 or len(group_ids) != rewards.shape[0]:
        raise ValueError(
            f"rewards must be [B] with one group id each; got {tuple(rewards.shape)}, {len(group_ids)}"
        )
    idx_np, num_groups = group_index(group_ids)
    idx = torch.as_tensor(idx_np, dtype=torch.long, device=rewards.device)
    sums = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, idx, rewards)
    counts = torch.zeros(num_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, idx, torch.ones_like(rewards)
    )
    return idx, sums, counts


def grpo_advantages(
    rewards: Tensor, group_ids: Sequence | np.ndarray, *, norm_by_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO advantage per response [B]: (r - mean_group) / (std_group + eps).

    std is the unbiased sample std of the group (Bessel-corrected, torch.std's default, as in the Skywork / verl
    lineage). A group whose rewards are all equal gets advantage 0; a group of one has no baseline and gets 0.
    With norm_by_std=False the advantage is r - mean_group (Dr. GRPO style).
    """
    rewards = rewards.float()
    idx, sums, counts = _group_sums(rewards, group_ids)
    mean = (sums / counts)[idx]
    centered = rewards - mean
    if not norm_by_std:
        return torch.where(counts[idx] > 1, centered, torch.zeros_like(centered))
    sq = torch.zeros_like(sums).index_add_(0, idx, centered.square())
    std = torch.sqrt(sq / (counts - 1).clamp(min=1.0))[idx]
    adv = centered / (std + eps)
    return torch.where(counts[idx] > 1, adv, torch.zeros_like(adv))


def rloo_advantages(rewards: Tensor, group_ids: Sequence | np.ndarray) -> Tensor:
    """RLOO advantage per response [B]: r_i - mean of the other responses of its group (0 for a group of one)."""
    rewards = rewards.float()
    idx, sums, counts = _group_sums(rewards, group_ids)
    n = counts[idx]
    others_mean = (sums[idx] - rewards) / (n - 1).clamp(min=1.0)
    return torch.where(n > 1, rewards - others_mean, torch.zeros_like(rewards))


def masked_whiten(values: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """(x - mean) / sqrt(var + eps) over the masked entries (unbiased var); masked-out entries become 0."""
    mask = mask.to(values.dtype)
    n = mask.sum()
    mean = (values * mask).sum() / n.clamp(min=1.0)
    var = (((values - mean) * mask).square()).sum() / (n - 1).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps) * mask


def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float, lam: float, whiten: bool = True
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens [B, T]; returns (advantages, returns).

    Runs backwards over T: delta_t = r_t + gamma * V_next - V_t, A_t = delta_t + gamma * lam * A_next, where
    "next" is the next token with mask 1 (padding is skipped; after the last response token V_next = A_next = 0).
    returns = raw advantages + values (the critic's target); the advantages are then whitened over the masked
    tokens, the usual PPO way (whiten=False keeps them raw). Masked-out positions are 0 in both outputs.
    """
    mask_f = mask.to(values.dtype)
    rewards = token_rewards.to(values.dtype)
    b, t = values.shape
    next_value = torch.zeros(b, dtype=values.dtype, device=values.device)
    next_adv = torch.zeros_like(next_value)
    raw = torch.zeros_like(values)
    for i in reversed(range(t)):
        delta = rewards[:, i] + gamma * next_value - values[:, i]
        adv_i = delta + gamma * lam * next_adv
        m = mask_f[:, i]
        raw[:, i] = adv_i * m
        # carry the last real token's value / advantage through padding positions
        next_value = m * values[:, i] + (1 - m) * next_value
        next_adv = m * adv_i + (1 - m) * next_adv
    returns = (raw + values) * mask_f
    advantages = masked_whiten(raw, mask_f) if whiten else raw
    return advantages, returns


def broadcast_to_tokens(seq_adv: Tensor, mask: Tensor) -> Tensor:
    """Spread one advantage per sequence [B] over its response tokens [B, T] (0 on padding)."""
    return seq_adv.unsqueeze(-1).to(torch.float32) * mask.to(torch.float32)


def scores_to_token_rewards(scores: Tensor, mask: Tensor) -> Tensor:
    """Place each response's score on its last loss token [B, T] (the token-reward form GAE and KL-in-reward use)."""
    mask_f = mask.to(torch.float32)
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask_f)
    last = torch.where(mask_f > 0, positions, torch.full_like(positions, -1)).max(-1).values
    out = torch.zeros_like(mask_f)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = scores.to(torch.float32)[rows]
    return out


@dataclass(frozen=True)
class AdvantageInputs:
    """What any estimator may need; built by the controller from the step's batch."""

    # [B, T] score on the last response token (scores_to_token_rewards), minus kl_coef * KL when the KL is in the reward
    token_rewards: Tensor
    mask: Tensor  # [B, T] response (loss) mask
    group_ids: Sequence | np.ndarray  # [B] prompt uid of each response (one group per prompt)
    values: Tensor | None = None  # [B, T] critic values, GAE only


@dataclass(frozen=True)
class AdvantageParams:
    """Estimator knobs, from AlgorithmConfig."""

    norm_adv_by_std: bool = True
    gamma: float = 1.0
    lam: float = 1.0

    @classmethod
    def from_config(cls, algorithm: AlgorithmConfig) -> AdvantageParams:
        return cls(norm_adv_by_std=algorithm.norm_adv_by_std, gamma=algorithm.gamma, lam=algorithm.lam)


Estimator = Callable[[AdvantageInputs, AdvantageParams], tuple[Tensor, Tensor]]


def _grpo(inp: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor]:
    scores = inp.token_rewards.sum(-1)
    adv = broadcast_to_tokens(grpo_advantages(scores, inp.group_ids, norm_by_std=p.norm_adv_by_std), inp.mask)
    return adv, adv


def _rloo(inp: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor]:
    adv = broadcast_to_tokens(rloo_advantages(inp.token_rewards.sum(-1), inp.group_ids), inp.mask)
    return adv, adv


def _gae(inp: AdvantageInputs, p: AdvantageParams) -> tuple[Tensor, Tensor]:
    if inp.values is None:
        raise ValueError("the gae advantage needs critic values (is the critic worker configured?)")
    return gae_advantages(inp.token_rewards, inp.values, inp.mask, gamma=p.gamma, lam=p.lam)


# name -> estimator(inputs, params) -> (token advantages [B, T], returns [B, T]); outcome estimators return adv twice.
ADVANTAGE_ESTIMATORS: dict[str, Estimator] = {"grpo": _grpo, "rloo": _rloo, "gae": _gae}


def compute_advantages(name: str, inputs: AdvantageInputs, params: AdvantageParams) -> tuple[Tensor, Tensor]:
    """Token advantages and returns [B, T] from the estimator registered under `name` (AlgorithmConfig.advantage)."""
    try:
        estimator = ADVANTAGE_ESTIMATORS[name]
    except KeyError:
        raise ValueError(
            f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGE_ESTIMATORS)}"
        ) from None
    return estimator(inputs, params)
