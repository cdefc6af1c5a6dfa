"""Loss aggregation, PPO-clip with clip-higher, KL kinds, log-probs / entropy and policy_loss, by hand."""

import math

import pytest
import torch

from or1.algos.aggregation import aggregate, loss_denominators
from or1.algos.losses import (
    LossConfig,
    entropy_from_logits,
    kl_penalty,
    policy_loss,
    token_log_probs,
    value_loss,
)
from or1.algos.policy_losses import ppo_clip_loss
from or1.config.schema import (
    ActorConfig,
    AlgorithmConfig,
    DataConfig,
    KLConfig,
    ModelConfig,
    RunConfig,
    StageInfo,
)


def close(actual: torch.Tensor, expected, atol: float = 1e-6) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


# Two sequences of unequal length: [1, 2, 3, 4] (4 tokens) and [10] (1 token); a third row has no loss tokens.
VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 20.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]])
MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_aggregation_modes_differ_on_unequal_lengths():
    # token-mean: (1 + 2 + 3 + 4 + 10) / 5 tokens = 4.0
    close(aggregate(VALUES, MASK, "token-mean"), 4.0)
    # seq-mean-token-mean: (mean 2.5, mean 10) / 2 sequences = 6.25 (the empty row does not count)
    close(aggregate(VALUES, MASK, "seq-mean-token-mean"), 6.25)
    # seq-mean-token-sum: (sum 10, sum 10) / 2 = 10
    close(aggregate(VALUES, MASK, "seq-mean-token-sum"), 10.0)
    assert loss_denominators(MASK) == (5.0, 2.0)


def test_aggregation_with_global_denominators_and_bad_mode():
    close(aggregate(VALUES, MASK, "token-mean", num_tokens=20.0), 20.0 / 20.0)
    close(aggregate(VALUES, MASK, "seq-mean-token-sum", num_seqs=4.0), 20.0 / 4.0)
    close(aggregate(VALUES * 0, MASK * 0, "token-mean"), 0.0)  # no tokens: 0, not nan
    with pytest.raises(ValueError, match="aggregation mode"):
        aggregate(VALUES, MASK, "sum")  # type: ignore[arg-type]


# Six tokens with old log-prob 0, so ratio r = exp(log_prob); clip_low 0.2, clip_high 0.28 (clip-higher):
#   tok  r     A    -A*r    -A*clip(r, 0.8, 1.28)  max (loss)  clipped?
#   0    1.5   +1   -1.5    -1.28                  -1.28       yes, upper bound
#   1    0.5   -1   +0.5    +0.8                   +0.8        yes, lower bound
#   2    1.1   +1   -1.1    -1.1                   -1.1        no
#   3    0.5   +1   -0.5    -0.8                   -0.5        no (pessimistic side is unclipped)
#   4    1.25  +1   -1.25   -1.25                  -1.25       no; with symmetric 0.2 it would clip to -1.2
#   5    1.5   -1   +1.5    +1.28                  +1.5        no
# token-mean = (-1.28 + 0.8 - 1.1 - 0.5 - 1.25 + 1.5) / 6 = -1.83 / 6 = -0.305
RATIOS = torch.tensor([[1.5, 0.5, 1.1, 0.5, 1.25, 1.5]])
ADV = torch.tensor([[1.0, -1.0, 1.0, 1.0, 1.0, -1.0]])
ONES = torch.ones(1, 6)


def test_ppo_clip_higher_hand_values_and_gradient():
    logp = RATIOS.log().requires_grad_()
    loss, m = ppo_clip_loss(logp, torch.zeros(1, 6), ADV, ONES, clip_low=0.2, clip_high=0.28)
    close(loss, -0.305, atol=1e-6)
    assert m["clip_frac"] == pytest.approx(2 / 6)
    assert m["clip_frac_high"] == pytest.approx(1 / 6)
    assert m["clip_frac_low"] == pytest.approx(1 / 6)
    assert m["ratio_mean"] == pytest.approx(6.35 / 6)
    kl = sum(r - 1 - math.log(r) for r in RATIOS[0].tolist()) / 6
    assert m["approx_kl"] == pytest.approx(kl, abs=1e-6)
    loss.backward()
    # d(-A r)/d logp = -A r on unclipped tokens, 0 where the clipped term is active; / 6 tokens
    close(logp.grad, [[0.0, 0.0, -1.1 / 6, -0.5 / 6, -1.25 / 6, 1.5 / 6]])


def test_ppo_symmetric_clip_catches_token_four():
    loss, m = ppo_clip_loss(RATIOS.log(), torch.zeros(1, 6), ADV, ONES, clip_low=0.2, clip_high=0.2)
    # tok0 -> -1.2, tok4 -> -1.2: (-1.2 + 0.8 - 1.1 - 0.5 - 1.2 + 1.5) / 6 = -1.7 / 6
    close(loss, -1.7 / 6)
    assert m["clip_frac"] == pytest.approx(3 / 6)
    assert m["clip_frac_high"] == pytest.approx(2 / 6)


def _toy_policy(seed: int = 0):
    """A tiny differentiable 'model': logits = emb @ W, for checking gradient accumulation."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(5, 6, 3, generator=g)
    weight = torch.randn(4, 3, generator=g, requires_grad=True)
    tokens = torch.randint(0, 4, (5, 6), generator=g)
    old = torch.randn(5, 6, generator=g) * 0.1 - 1.4
    adv = torch.randn(5, 1, generator=g).expand(5, 6).contiguous()
    # unequal lengths 6, 2, 4, 1, 5
    mask = (torch.arange(6).expand(5, 6) < torch.tensor([[6], [2], [4], [1], [5]])).float()
    return emb, weight, tokens, old, adv, mask


@pytest.mark.parametrize(
    "mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"]
)
def test_micro_batches_with_global_denominators_equal_the_full_batch(mode):
    emb, weight, tokens, old, adv, mask = _toy_policy()
    cfg = LossConfig(clip_low=0.2, clip_high=0.28, agg_mode=mode, norm_length=8.0)

    def loss_of(rows, **denoms):
        logp = token_log_probs(emb[rows] @ weight.T, tokens[rows], temperature=0.7)
        return policy_loss(logp, old[rows], adv[rows], mask[rows], cfg, **denoms)[0]

    full = loss_of(slice(0, 5))
    (full_grad,) = torch.autograd.grad(full, weight)
    num_tokens, num_seqs = loss_denominators(mask)
    assert (num_tokens, num_seqs) == (18.0, 5.0)
    total = 0.0
    for rows in (
        slice(0, 2),
        slice(2, 3),
        slice(3, 5),
    ):  # unequal micro-batches, accumulated like the engine does
        part = loss_of(rows, num_tokens=num_tokens, num_seqs=num_seqs)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-6)
    close(weight.grad, full_grad, atol=1e-6)
    # without the global counts each micro-batch normalises locally and the sum is not the full-batch loss
    local = sum(loss_of(r).item() for r in (slice(0, 2), slice(2, 3), slice(3, 5)))
    assert local != pytest.approx(full.item(), abs=1e-3)


def test_kl_kinds_hand_values():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    close(kl_penalty(logp, ref, "k1"), [[0.5, -1.0]])  # logp - ref
    close(kl_penalty(logp, ref, "k2"), [[0.125, 0.5]])  # (logp - ref)^2 / 2
    # k3: x = ref - logp = [-0.5, 1.0]; exp(x) - x - 1 = [0.6065307 + 0.5 - 1, 2.7182818 - 2]
    close(kl_penalty(logp, ref, "k3"), [[0.1065307, 0.7182818]])
    # a wild token: x = 50 would give e^50; the log-ratio is clamped to 20 and the value to 10
    close(kl_penalty(torch.tensor([[0.0]]), torch.tensor([[50.0]]), "k3"), [[10.0]])
    assert torch.all(kl_penalty(torch.randn(3, 4), torch.randn(3, 4), "k3") >= 0)
    with pytest.raises(ValueError, match="KL kind"):
        kl_penalty(logp, ref, "k4")  # type: ignore[arg-type]


def test_token_log_probs_with_temperature():
    logits = torch.tensor([[[0.0, 0.0, math.log(2.0)]]])
    # softmax = [1/4, 1/4, 1/2]
    close(token_log_probs(logits, torch.tensor([[2]]), 1.0), [[math.log(0.5)]])
    close(token_log_probs(logits, torch.tensor([[0]]), 1.0), [[math.log(0.25)]])
    # T = 2: z = [0, 0, ln2 / 2] -> p2 = sqrt2 / (2 + sqrt2)
    close(token_log_probs(logits, torch.tensor([[2]]), 2.0), [[math.log(math.sqrt(2) / (2 + math.sqrt(2)))]])
    # huge logits stay finite (bf16 input is upcast)
    big = torch.tensor([[[1e4, 0.0, -1e4]]], dtype=torch.bfloat16)
    close(token_log_probs(big, torch.tensor([[0]]), 1.0), [[0.0]])
    with pytest.raises(ValueError):
        token_log_probs(logits, torch.tensor([[0]]), 0.0)


def test_entropy_hand_values():
    logits = torch.tensor(
        [[[0.0, 0.0, 0.0, 0.0], [0.0, 0.0, math.log(2.0), -math.inf], [1000.0, 0.0, 0.0, 0.0]]]
    )
    # uniform over 4: ln 4; [1/4, 1/4, 1/2, 0] (a -inf logit, e.g. masked vocabulary): 0.5 ln4 + 0.5 ln2 = 1.0397208; near one-hot: 0 (no nan)
    close(entropy_from_logits(logits), [[math.log(4), 0.5 * math.log(4) + 0.5 * math.log(2), 0.0]])


def test_chunked_over_time_equals_unchunked_with_gradients():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(2, 7, 11, generator=g, requires_grad=True)
    tokens = torch.randint(0, 11, (2, 7), generator=g)
    whole_lp, whole_h = token_log_probs(logits, tokens, 0.8), entropy_from_logits(logits, 0.8)
    grads = torch.autograd.grad((whole_lp.sum() + whole_h.sum()), logits)[0]
    part_lp, part_h = token_log_probs(logits, tokens, 0.8, chunk=3), entropy_from_logits(logits, 0.8, chunk=3)
    close(part_lp, whole_lp.detach())
    close(part_h, whole_h.detach())
    close(torch.autograd.grad(part_lp.sum() + part_h.sum(), logits)[0], grads)
    ref = torch.log_softmax(logits.detach() / 0.8, -1)
    close(whole_lp.detach(), ref.gather(-1, tokens.unsqueeze(-1)).squeeze(-1))
    close(whole_h.detach(), -(ref.exp() * ref).sum(-1), atol=1e-5)


def test_policy_loss_adds_entropy_bonus_and_kl():
    logp = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    cfg = LossConfig(kl_coef=0.5, kl_kind="k1")
    # ratio 1 -> pg = mean(-A) = 0; entropy mean (1 + 3) / 2 = 2; k1 = logp - ref = [0.2, 0.4], mean 0.3
    # loss = 0 - 0.1 * 2 + 0.5 * 0.3 = -0.05
    loss, m = policy_loss(
        logp,
        logp,
        adv,
        mask,
        cfg,
        entropy=torch.tensor([[1.0, 3.0]]),
        entropy_coef=0.1,
        ref_log_probs=logp - torch.tensor([[0.2, 0.4]]),
    )
    close(loss, -0.05)
    assert m["pg_loss"] == pytest.approx(0.0)
    assert m["entropy"] == pytest.approx(2.0)
    assert m["kl"] == pytest.approx(0.3)
    assert m["tokens"] == 2.0
    with pytest.raises(ValueError, match="no entropy"):
        policy_loss(logp, logp, adv, mask, LossConfig(), entropy_coef=0.1)
    with pytest.raises(ValueError, match="ref_log_probs"):
        policy_loss(logp, logp, adv, mask, cfg)
    # entropy given with alpha 0 (above target): logged, not in the loss
    loss, m = policy_loss(logp, logp, adv, mask, LossConfig(), entropy=torch.tensor([[1.0, 3.0]]))
    close(loss, 0.0)
    assert m["entropy"] == pytest.approx(2.0)


def _run_config(**algorithm) -> RunConfig:
    return RunConfig(
        recipe="t",
        stage=StageInfo(index=1, name="s1"),
        model=ModelConfig(path="m"),
        data=DataConfig(train_files=["d.parquet"]),
        actor=ActorConfig(clip_ratio_high=0.28, loss_agg_mode="seq-mean-token-mean"),
        algorithm=AlgorithmConfig(**algorithm),
    )


def test_loss_config_from_run_config():
    cfg = LossConfig.from_config(_run_config())
    assert (cfg.clip_low, cfg.clip_high, cfg.agg_mode, cfg.kl_coef, cfg.needs_ref) == (
        0.2,
        0.28,
        "seq-mean-token-mean",
        0.0,
        False,
    )
    cfg = LossConfig.from_config(_run_config(kl=KLConfig(enabled=True, coef=0.01, kind="k2")))
    assert (cfg.kl_coef, cfg.kl_kind, cfg.needs_ref) == (0.01, "k2", True)
    # KL in the reward: no KL loss term
    assert LossConfig.from_config(_run_config(kl=KLConfig(enabled=True, in_reward=True))).kl_coef == 0.0


def test_value_loss_clips_around_the_old_values_by_hand():
    # token 0: |V - V_old| = 0.1 inside the clip: 0.5 * (0.6 - 1)^2 = 0.08
    # token 1: V moved +1.0 past the 0.2 clip; V_clip = 0.2, G = 0: max(1.0, 0.04) * 0.5 = 0.5 (unclipped is larger)
    # token 2: V moved -1.0, V_clip = -0.2, G = 1: unclipped 0.5 * 4 = 2, clipped 0.5 * 1.44 = 0.72 -> 2
    # token 3: V moved +0.5 towards G = 1 from 0: unclipped 0.5 * 0.25 = 0.125, clipped 0.5 * 0.64 = 0.32 -> 0.32
    # token 4: masked out
    values = torch.tensor([[0.6, 1.0, -1.0, 0.5, 9.0]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 0.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, cliprange=0.2)
    assert loss.item() == pytest.approx((0.08 + 0.5 + 2.0 + 0.32) / 4)
    assert metrics["vf_clip_frac"] == pytest.approx(0.25)  # only token 3's clipped term is the larger one
    assert metrics["value_mean"] == pytest.approx((0.6 + 1.0 - 1.0 + 0.5) / 4)
    loss.backward()
    # d/dV of 0.5 (V - G)^2 / 4 where unclipped is active; 0 where the clipped term wins (token 3) or masked
    close(values.grad, torch.tensor([[(0.6 - 1.0) / 4, 1.0 / 4, -2.0 / 4, 0.0, 0.0]]))
    half, _ = value_loss(values, old, returns, mask, cliprange=0.2, num_tokens=8.0)
    assert half.item() == pytest.approx(loss.item() / 2)  # a global denominator twice the local count
    # NaN at the padding position (old value, return, even the value itself): same loss, finite gradient
    dirty_values = values.detach().clone()
    dirty_values[0, 4] = float("nan")
    dirty_values.requires_grad_()
    dirty_old, dirty_returns = old.clone(), returns.clone()
    dirty_old[0, 4] = dirty_returns[0, 4] = float("nan")
    dirty, _ = value_loss(dirty_values, dirty_old, dirty_returns, mask, cliprange=0.2)
    dirty.backward()
    assert dirty.item() == pytest.approx(loss.item())
    close(dirty_values.grad, values.grad)


# Dual clip (verl's compute_policy_loss, clip_ratio_c = 3): for A < 0 the loss is min(max(-A r, -A clip(r)), -A c).
#   tok  r     A    -A*r   -A*clip(r, 0.8, 1.2)  PPO loss  dual bound -A*3  dual loss
#   0    5.0   -1   +5.0   +1.2                  +5.0      +3.0             +3.0  (dual bound active, no gradient)
#   1    2.0   -1   +2.0   +1.2                  +2.0      +3.0             +2.0
#   2    5.0   +1   -5.0   -1.2                  -1.2      (A > 0: unchanged) -1.2
#   3    0.5   -2   +1.0   +1.6                  +1.6      +6.0             +1.6
# token-mean: (3.0 + 2.0 - 1.2 + 1.6) / 4 = 1.35; without dual clip (5.0 + 2.0 - 1.2 + 1.6) / 4 = 1.85
DUAL_R = torch.tensor([[5.0, 2.0, 5.0, 0.5]])
DUAL_A = torch.tensor([[-1.0, -1.0, 1.0, -2.0]])


def test_dual_clip_bounds_the_loss_of_negative_advantages_only():
    logp = DUAL_R.log().requires_grad_()
    loss, m = ppo_clip_loss(
        logp, torch.zeros(1, 4), DUAL_A, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, clip_ratio_c=3.0
    )
    close(loss, 1.35, atol=1e-6)
    assert m["clip_frac_dual"] == pytest.approx(1 / 4)
    loss.backward()
    # d(-A r)/d logp = -A r: token 1 (unclipped) 2.0 / 4; tokens 0 (dual), 2 and 3 (clipped) have none
    close(logp.grad, [[0.0, 0.5, 0.0, 0.0]])
    plain, m_plain = ppo_clip_loss(
        DUAL_R.log(), torch.zeros(1, 4), DUAL_A, torch.ones(1, 4), clip_low=0.2, clip_high=0.2
    )
    close(plain, 1.85, atol=1e-6)
    assert "clip_frac_dual" not in m_plain
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ppo_clip_loss(
            logp, torch.zeros(1, 4), DUAL_A, torch.ones(1, 4), clip_low=0.2, clip_high=0.2, clip_ratio_c=1.0
        )


def test_seq_mean_token_sum_norm_divides_by_the_response_budget():
    # Dr. GRPO ("Understanding R1-Zero-Like Training", verl's seq-mean-token-sum-norm with a constant divisor):
    # per-sequence sums 10 and 10 over the budget 8, mean over the 2 sequences with loss tokens: (1.25 + 1.25) / 2
    close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=8.0), 1.25)
    # without a budget the padded width (4) is the constant: (2.5 + 2.5) / 2
    close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm"), 2.5)
    # global denominators: 4 sequences in the whole step -> 20 / 8 / 4
    close(aggregate(VALUES, MASK, "seq-mean-token-sum-norm", num_seqs=4.0, norm_length=8.0), 20.0 / 8.0 / 4.0)


def test_nan_at_padding_reaches_neither_loss_nor_gradient():
    # Row 2 has loss tokens 0-1 only; positions 2-3 are padding holding NaN / inf, as a padded forward pass may give.
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    nan, inf = float("nan"), float("inf")
    logp_clean = torch.tensor([[-1.0, -0.5, -0.2, -2.0], [-0.3, -1.0, 0.0, 0.0]])
    logp_dirty = logp_clean.clone()
    logp_dirty[1, 2:] = nan
    old = torch.tensor([[-1.1, -0.4, -0.2, -1.9], [-0.3, -1.2, nan, inf]])
    adv = torch.tensor([[0.5] * 4, [-1.0, -1.0, nan, nan]])
    ref = torch.tensor([[-1.0] * 4, [-0.5, -0.5, nan, -inf]])
    entropy = torch.tensor([[0.7] * 4, [0.9, 0.8, nan, nan]])
    cfg = LossConfig(
        clip_low=0.2,
        clip_high=0.28,
        clip_ratio_c=3.0,
        kl_coef=0.1,
        agg_mode="seq-mean-token-sum-norm",
        norm_length=8.0,
    )
    losses, grads = [], []
    for logp, o, a, r, h in (
        (logp_dirty, old, adv, ref, entropy),
        (
            logp_clean,
            old.nan_to_num(0.0, 0.0, 0.0),
            adv.nan_to_num(0.0),
            ref.nan_to_num(0.0, 0.0, 0.0),
            entropy.nan_to_num(0.0),
        ),
    ):
        logp = logp.clone().requires_grad_()
        loss, metrics = policy_loss(logp, o, a, mask, cfg, entropy=h, entropy_coef=0.01, ref_log_probs=r)
        loss.backward()
        losses.append(loss.detach())
        grads.append(logp.grad)
        assert all(math.isfinite(v) for v in metrics.values())
    assert torch.isfinite(losses[0]) and torch.isfinite(grads[0]).all()
    close(losses[0], losses[1])
    close(grads[0], grads[1])
    assert grads[0][1, 2:].abs().sum() == 0  # padding gets no gradient


def test_loss_config_carries_dual_clip_and_the_norm_length():
    config = _run_config()
    assert (
        LossConfig.from_config(config).clip_ratio_c is None
    )  # off by default, as in Skywork-OR1's verl fork
    config.actor.clip_ratio_c = 3.0
    config.actor.loss_agg_mode = "seq-mean-token-sum-norm"
    cfg = LossConfig.from_config(config)
    assert (cfg.clip_ratio_c, cfg.agg_mode, cfg.norm_length) == (
        3.0,
        "seq-mean-token-sum-norm",
        float(config.rollout.max_response_length),
    )


def test_policy_loss_uses_the_variant_the_config_names():
    config = _run_config()
    assert LossConfig.from_config(config).policy_loss == "ppo"
    config.actor.policy_loss = "cispo"
    cfg = LossConfig.from_config(config)
    log_probs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old, adv, mask = torch.tensor([[-1.5, -2.0]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[1, 1]])
    loss, _ = policy_loss(log_probs, old, adv, mask, cfg)
    loss.backward()
    # CISPO: d/d logp of -sg(clip(r)) A logp / 2 tokens, r = e^0.5 clipped to 1.28 and e^0 = 1
    close(log_probs.grad, [[-1.28 / 2, -1.0 / 2]])
