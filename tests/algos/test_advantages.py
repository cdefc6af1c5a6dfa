"""GRPO / RLOO / GAE advantages against values worked out by hand."""

import math

import numpy as np
import pytest
import torch

from or1.algos.advantages import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInputs,
    AdvantageParams,
    broadcast_to_tokens,
    compute_advantages,
    gae_advantages,
    grpo_advantages,
    rloo_advantages,
    scores_to_token_rewards,
)
from or1.config.schema import AlgorithmConfig

# Group a = [1, 0, 0, 1]: mean 0.5, unbiased var = 4 * 0.25 / 3 = 1/3, std = 0.57735 -> A = +-0.5 / 0.57735 = +-0.866
# Group b = [1, 1, 1, 1]: zero variance -> A = 0 (not 0 / eps blow-up)
# Group c = [0, 1, 0, 0]: mean 0.25, squares 3 * 0.0625 + 0.5625 = 0.75, var 0.25, std 0.5 -> A = -0.5, 1.5, -0.5, -0.5
# Ids are interleaved on purpose: groups are found by id, not by position.
IDS = np.array(["a", "b", "a", "c", "b", "c", "a", "c", "b", "a", "b", "c"], dtype=object)
REWARDS = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0])


def close(actual: torch.Tensor, expected: list, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def by_group(adv: torch.Tensor, gid: str) -> list[float]:
    return adv[torch.as_tensor(np.flatnonzero(IDS == gid))].tolist()


def test_grpo_hand_values_with_zero_variance_group():
    adv = grpo_advantages(REWARDS, IDS)
    s = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert by_group(adv, "a") == pytest.approx([s, -s, -s, s], abs=1e-6)
    assert by_group(adv, "b") == [0.0, 0.0, 0.0, 0.0]
    c = 0.25 / (0.5 + 1e-6)
    assert by_group(adv, "c") == pytest.approx([-c, 3 * c, -c, -c], abs=1e-6)


def test_grpo_uses_the_unbiased_std_like_torch_std():
    adv = grpo_advantages(REWARDS, IDS, eps=0.0)
    a = REWARDS[torch.as_tensor(np.flatnonzero(IDS == "a"))]
    assert by_group(adv, "a") == pytest.approx(((a - a.mean()) / a.std()).tolist(), abs=1e-6)


def test_grpo_without_std_and_group_of_one():
    adv = grpo_advantages(REWARDS, IDS, norm_by_std=False)
    assert by_group(adv, "a") == pytest.approx([0.5, -0.5, -0.5, 0.5])
    assert by_group(adv, "c") == pytest.approx([-0.25, 0.75, -0.25, -0.25])
    lone = grpo_advantages(torch.tensor([1.0, 0.0, 1.0]), [7, 8, 8])
    assert lone.tolist() == pytest.approx(
        [0.0, -0.5 / (math.sqrt(0.5) + 1e-6), 0.5 / (math.sqrt(0.5) + 1e-6)]
    )


def test_rloo_hand_values():
    # [1, 0, 0, 1]: r0 = 1 - (0 + 0 + 1) / 3 = 2/3; r1 = 0 - (1 + 0 + 1) / 3 = -2/3. [1, 1] -> 0; lone -> 0
    adv = rloo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0]), [0, 0, 0, 0, 1, 1, 2])
    assert adv.tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0, 0.0])


def test_rewards_and_ids_must_match():
    with pytest.raises(ValueError):
        grpo_advantages(torch.tensor([1.0, 0.0]), ["a"])


# GAE, gamma 0.9, lam 0.8 (gamma * lam = 0.72), hand-unrolled backwards.
# Row 0: V = [0.5, 0.2, 0.1, pad], r = [0, 0, 1, pad]
#   t2: delta = 1 + 0 - 0.1 = 0.9                      A2 = 0.9
#   t1: delta = 0 + 0.9 * 0.1 - 0.2 = -0.11           A1 = -0.11 + 0.72 * 0.9 = 0.538
#   t0: delta = 0 + 0.9 * 0.2 - 0.5 = -0.32           A0 = -0.32 + 0.72 * 0.538 = 0.06736
# Row 1: mask [1, 0, 1, 0] with junk at the masked slot: it is skipped, V_next / A_next carry over it.
#   t2: delta = 1 - 0.1 = 0.9                          A2 = 0.9
#   t0: delta = 0 + 0.9 * 0.1 - 0.5 = -0.41           A0 = -0.41 + 0.72 * 0.9 = 0.238
GAE_V = torch.tensor([[0.5, 0.2, 0.1, 7.0], [0.5, 9.0, 0.1, 7.0]])
GAE_R = torch.tensor([[0.0, 0.0, 1.0, 3.0], [0.0, 5.0, 1.0, 3.0]])
GAE_M = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0]])
GAE_RAW = [[0.06736, 0.538, 0.9, 0.0], [0.238, 0.0, 0.9, 0.0]]


def test_gae_matches_hand_unrolled_recursion():
    adv, ret = gae_advantages(GAE_R, GAE_V, GAE_M, gamma=0.9, lam=0.8, whiten=False)
    assert adv.tolist()[0] == pytest.approx(GAE_RAW[0], abs=1e-6)
    assert adv.tolist()[1] == pytest.approx(GAE_RAW[1], abs=1e-6)
    # returns = raw advantage + value on real tokens, 0 on padding
    assert ret.tolist()[0] == pytest.approx([0.56736, 0.738, 1.0, 0.0], abs=1e-6)
    assert ret.tolist()[1] == pytest.approx([0.738, 0.0, 1.0, 0.0], abs=1e-6)


def test_gae_whitens_over_masked_tokens_only():
    adv, _ = gae_advantages(GAE_R, GAE_V, GAE_M, gamma=0.9, lam=0.8)
    real = np.array([0.06736, 0.538, 0.9, 0.238, 0.9])  # the five real tokens
    white = (real - real.mean()) / math.sqrt(real.var(ddof=1) + 1e-8)
    assert [adv[0, 0], adv[0, 1], adv[0, 2], adv[1, 0], adv[1, 2]] == pytest.approx(white.tolist(), abs=1e-5)
    assert adv[0, 3] == 0 and adv[1, 1] == 0 and adv[1, 3] == 0


def test_gae_gamma_lam_one_is_reward_to_go_minus_value():
    adv, ret = gae_advantages(GAE_R[:1], GAE_V[:1], GAE_M[:1], gamma=1.0, lam=1.0, whiten=False)
    assert ret.tolist()[0] == pytest.approx([1.0, 1.0, 1.0, 0.0])  # the outcome reward reaches every token
    assert adv.tolist()[0] == pytest.approx([0.5, 0.8, 0.9, 0.0])


def test_broadcast_and_token_rewards():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0]])
    assert broadcast_to_tokens(torch.tensor([2.0, -1.0, 5.0]), mask).tolist() == [
        [2.0, 2.0, 0.0],
        [-1.0, -1.0, -1.0],
        [0.0, 0.0, 0.0],
    ]
    assert scores_to_token_rewards(torch.tensor([1.0, 2.0, 3.0]), mask).tolist() == [
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 2.0],
        [0.0, 0.0, 0.0],
    ]


def test_registry_dispatch_by_config_name():
    assert set(ADVANTAGE_ESTIMATORS) == {"grpo", "rloo", "gae"}
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    inputs = AdvantageInputs(scores_to_token_rewards(torch.tensor([1.0, 0.0]), mask), mask, ["p", "p"])
    params = AdvantageParams.from_config(AlgorithmConfig())
    adv, ret = compute_advantages("grpo", inputs, params)
    s = 0.5 / (math.sqrt(0.5) + 1e-6)
    close(adv, [[s, s, 0.0], [-s, -s, -s]])
    assert torch.equal(adv, ret)
    adv, _ = compute_advantages("rloo", inputs, params)
    close(adv, [[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]])
    with pytest.raises(ValueError, match="critic values"):
        compute_advantages("gae", inputs, params)
    with pytest.raises(ValueError, match="unknown advantage estimator"):
        compute_advantages("ppo", inputs, params)
