"""GSPO and CISPO against their papers' formulas on the same tensors, and rollout-correction weights in PPO-clip."""

import torch

from or1.algos.policy_losses import POLICY_LOSSES, cispo_loss, gspo_loss, ppo_clip_loss

OLD = torch.tensor([[-1.0, -2.0, -0.5, 0.0], [-0.7, -1.2, 0.0, 0.0]])
NEW = torch.tensor([[-0.9, -2.2, -0.45, 0.0], [-0.2, -1.0, 0.0, 0.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
ADV = torch.tensor([[1.0] * 4, [-0.5] * 4])  # GRPO: one advantage per response


def grad_of(fn) -> tuple[torch.Tensor, torch.Tensor]:
    log_probs = NEW.clone().requires_grad_(True)
    loss = fn(log_probs)
    loss.backward()
    return loss.detach(), log_probs.grad


def test_gspo_equals_the_sequence_level_objective():
    low, high = 0.05, 0.1

    def paper(lp: torch.Tensor) -> torch.Tensor:
        # J = 1/G sum_i min(s_i A_i, clip(s_i, 1 - low, 1 + high) A_i), s_i = (pi(y_i) / pi_old(y_i))^(1 / |y_i|)
        m = MASK.float()
        s = torch.exp(((lp - OLD) * m).sum(-1) / m.sum(-1))
        a = ADV[:, 0]
        return -torch.minimum(s * a, s.clamp(1 - low, 1 + high) * a).mean()

    ours, ours_grad = grad_of(
        lambda lp: gspo_loss(
            lp, OLD, ADV, MASK, clip_low=low, clip_high=high, agg_mode="seq-mean-token-mean"
        )[0]
    )
    reference, reference_grad = grad_of(paper)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)
    # row 0: A > 0 and s = e^{-0.0167} inside the bounds, so every token moves by the same s * A / (G |y_0|)
    assert torch.allclose(ours_grad[0, :3], ours_grad[0, :1].expand(3)) and ours_grad[0, 3] == 0


def test_cispo_keeps_every_gradient_with_a_clipped_weight():
    low, high = 1.0, 0.2  # no lower bound, as MiniMax-M1

    def paper(lp: torch.Tensor) -> torch.Tensor:
        # J = 1 / sum|o_i| sum_i sum_t sg(clip(r_it, 1 - low, 1 + high)) A_it log pi(o_it)
        r = torch.exp(NEW - OLD).clamp(1 - low, 1 + high)
        return -(r * ADV * lp * MASK).sum() / MASK.sum()

    ours, ours_grad = grad_of(lambda lp: cispo_loss(lp, OLD, ADV, MASK, clip_low=low, clip_high=high)[0])
    reference, reference_grad = grad_of(paper)
    torch.testing.assert_close(ours, reference)
    torch.testing.assert_close(ours_grad, reference_grad)
    assert (
        ours_grad[MASK.bool()] != 0
    ).all()  # row 1's ratio e^0.5 is clipped, yet its tokens keep a gradient
    expected = -torch.exp(NEW - OLD).clamp(max=1.2) * ADV / MASK.sum()
    torch.testing.assert_close(ours_grad[MASK.bool()], expected[MASK.bool()])


def test_is_weights_scale_each_tokens_ppo_loss():
    weights = torch.tensor([[0.5, 2.0, 1.0, 0.0], [1.5, 0.25, 0.0, 0.0]])
    plain, plain_grad = grad_of(lambda lp: ppo_clip_loss(lp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2)[0])
    _, weighted_grad = grad_of(
        lambda lp: ppo_clip_loss(lp, OLD, ADV, MASK, clip_low=0.2, clip_high=0.2, is_weights=weights)[0]
    )
    torch.testing.assert_close(weighted_grad, plain_grad * weights)


def test_registry_names_every_variant():
    assert set(POLICY_LOSSES) == {"ppo", "gspo", "cispo"}
