"""Truncated responses: reward 0 (default) or out of the loss."""

import numpy as np
import pytest
import torch

from or1.algos.advantages import grpo_advantages
from or1.algos.truncation import apply_truncation_policy, overlong_penalty

REWARDS = torch.tensor([1.0, 1.0, 0.0, 1.0])
TRUNC = torch.tensor([False, True, True, False])
MASK = torch.ones(4, 3)


def test_zero_reward_zeroes_truncated_rewards_and_keeps_the_mask():
    rewards, mask = apply_truncation_policy(REWARDS, TRUNC, MASK, "zero_reward")
    assert rewards.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert torch.equal(mask, MASK)
    assert REWARDS.tolist() == [1.0, 1.0, 0.0, 1.0]  # inputs untouched


def test_mask_removes_truncated_rows_from_the_loss_only():
    rewards, mask = apply_truncation_policy(REWARDS, TRUNC, MASK, "mask")
    assert rewards.tolist() == REWARDS.tolist()
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 1, 1]]


def test_zero_reward_gives_truncated_answers_negative_advantage():
    # one group: [1, 0(truncated), 0, 1] -> mean 0.5: the truncated response gets the same -0.866 as a wrong one
    rewards, _ = apply_truncation_policy(REWARDS, TRUNC, MASK, "zero_reward")
    adv = grpo_advantages(rewards, np.zeros(4))
    assert adv[1].item() == pytest.approx(adv[2].item()) and adv[1].item() < 0


def test_unknown_policy_and_shape_errors():
    with pytest.raises(ValueError, match="truncation policy"):
        apply_truncation_policy(REWARDS, TRUNC, MASK, "drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shapes"):
        apply_truncation_policy(REWARDS, TRUNC[:2], MASK, "mask")


def test_dapo_overlong_penalty_by_hand():
    # budget 20, buffer 4: no penalty up to 16 tokens, then -1/4 per token (x penalty 0.5), -0.5 at the budget
    lengths = torch.tensor([10, 16, 17, 18, 20])
    penalty = overlong_penalty(lengths, budget=20, buffer=4, penalty=0.5)
    torch.testing.assert_close(penalty, torch.tensor([0.0, 0.0, -0.125, -0.25, -0.5]))
    assert torch.equal(overlong_penalty(lengths, budget=20, buffer=0, penalty=1.0), torch.zeros(5))
