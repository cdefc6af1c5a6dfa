"""The adaptive entropy controller over scripted entropy sequences, coefficients worked out by hand."""

import json

import pytest
import torch

from or1.algos.entropy_control import AdaptiveEntropyController, entropy_estimate
from or1.config.schema import EntropyControlConfig


def run(ctrl: AdaptiveEntropyController, entropies: list[float]) -> tuple[list[float], list[float]]:
    """(alpha of each step, coefficient after each step)."""
    alphas, coefs = [], []
    for e in entropies:
        alphas.append(ctrl.step(e))
        coefs.append(ctrl.coef)
    return alphas, coefs


def test_paper_knobs_scripted_sequence():
    # target 0.2, delta 0.005, c0 = 0, no upper clamp. alpha_k = c_k if e_k < 0.2, then c moves by +-delta.
    #   k  e_k   below  alpha_k  c_{k+1}
    #   0  0.30  no     0        max(0 - 0.005, 0) = 0
    #   1  0.15  yes    0        0.005
    #   2  0.10  yes    0.005    0.010
    #   3  0.18  yes    0.010    0.015
    #   4  0.25  no     0        0.010
    #   5  0.12  yes    0.010    0.015
    #   6  0.20  no (=) 0        0.010
    ctrl = AdaptiveEntropyController.from_config(EntropyControlConfig())
    alphas, coefs = run(ctrl, [0.30, 0.15, 0.10, 0.18, 0.25, 0.12, 0.20])
    assert alphas == pytest.approx([0, 0, 0.005, 0.010, 0, 0.010, 0])
    assert coefs == pytest.approx([0, 0.005, 0.010, 0.015, 0.010, 0.015, 0.010])
    assert ctrl.metrics() == pytest.approx({"coef": 0.010, "alpha": 0.0, "target": 0.2, "entropy": 0.20})


def test_paper_knobs_have_no_upper_clamp():
    ctrl = AdaptiveEntropyController.from_config(EntropyControlConfig())
    alphas, coefs = run(ctrl, [0.05] * 300)
    assert coefs[-1] == pytest.approx(300 * 0.005)  # 1.5: nothing stops it (why the repository added a max)
    assert alphas[-1] == pytest.approx(299 * 0.005)


def test_repository_knobs_clamp_at_max():
    # delta 1e-4, max 0.005: below target for 52 steps, c_k = min(k * 1e-4, 0.005) reaches the clamp at k = 50;
    # then one step above target: alpha 0 and c = 0.005 - 1e-4 = 0.0049; then below again: alpha 0.0049.
    cfg = EntropyControlConfig(delta=0.0001, max_coef=0.005, min_coef=0.0)
    ctrl = AdaptiveEntropyController.from_config(cfg)
    alphas, coefs = run(ctrl, [0.1] * 52 + [0.3, 0.1])
    assert alphas[:3] == pytest.approx([0.0, 0.0001, 0.0002])
    assert alphas[49] == pytest.approx(0.0049)
    assert alphas[50] == pytest.approx(0.005) and alphas[51] == pytest.approx(0.005)
    assert coefs[49] == pytest.approx(0.005) and coefs[51] == pytest.approx(0.005)
    assert alphas[52] == 0.0 and coefs[52] == pytest.approx(0.0049)
    assert alphas[53] == pytest.approx(0.0049) and coefs[53] == pytest.approx(0.005)


def test_repository_timing_switches_on_the_previous_estimate():
    # SkyworkAI/Skywork-OR1 code: alpha_k = c_k * [e_{k-1} < target] (on at step 0); c_k as in the paper.
    #   k  e_k   switch (from e_{k-1})  alpha_k  c_{k+1}
    #   0  0.30  on (initial)           0        0
    #   1  0.15  off                    0        0.005
    #   2  0.10  on                     0.005    0.010
    #   3  0.25  on                     0.010    0.005     (paper timing: 0)
    #   4  0.12  off                    0        0.010     (paper timing: 0.005)
    seq = [0.30, 0.15, 0.10, 0.25, 0.12]
    repo = AdaptiveEntropyController.from_config(EntropyControlConfig(timing="repository"))
    paper = AdaptiveEntropyController.from_config(EntropyControlConfig())
    repo_alphas, repo_coefs = run(repo, seq)
    paper_alphas, paper_coefs = run(paper, seq)
    assert repo_alphas == pytest.approx([0, 0, 0.005, 0.010, 0])
    assert paper_alphas == pytest.approx([0, 0, 0.005, 0, 0.005])
    assert repo_coefs == pytest.approx([0, 0.005, 0.010, 0.005, 0.010])
    assert paper_coefs == pytest.approx(repo_coefs)


def test_init_and_min_coef():
    ctrl = AdaptiveEntropyController(target=0.2, delta=0.01, init_coef=0.03, min_coef=0.015)
    alphas, coefs = run(ctrl, [0.1, 0.5, 0.5, 0.5])
    assert alphas == pytest.approx([0.03, 0, 0, 0])
    assert coefs == pytest.approx([0.04, 0.03, 0.02, 0.015])


def test_fixed_and_off_modes():
    fixed = AdaptiveEntropyController.from_config(EntropyControlConfig(mode="fixed", fixed_coef=1e-3))
    assert run(fixed, [0.1, 0.5, 0.1])[0] == [1e-3, 1e-3, 1e-3]
    assert fixed.metrics()["coef"] == 1e-3
    off = AdaptiveEntropyController.from_config(EntropyControlConfig(mode="off"))
    assert run(off, [0.1, 0.5])[0] == [0.0, 0.0]
    assert off.metrics()["coef"] == 0.0


def test_state_dict_resume_continues_identically():
    seq = [0.1, 0.1, 0.3, 0.1, 0.15, 0.25, 0.1]
    whole = AdaptiveEntropyController(delta=0.005, timing="repository")
    expected = run(whole, seq)[0]
    first = AdaptiveEntropyController(delta=0.005, timing="repository")
    head = run(first, seq[:3])[0]
    state = json.loads(json.dumps(first.state_dict()))  # survives a JSON checkpoint
    resumed = AdaptiveEntropyController(delta=0.005, timing="repository")
    resumed.load_state_dict(state)
    assert head + run(resumed, seq[3:])[0] == pytest.approx(expected)
    assert resumed.steps == len(seq)


def test_invalid_settings():
    with pytest.raises(ValueError):
        AdaptiveEntropyController(min_coef=0.01, max_coef=0.001)
    with pytest.raises(ValueError):
        AdaptiveEntropyController(mode="sometimes")  # type: ignore[arg-type]


def test_entropy_estimate_is_mean_negative_logprob_of_response_tokens():
    old = torch.tensor([[-0.1, -0.3, -5.0], [-0.2, -9.0, -9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert entropy_estimate(old, mask) == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    with pytest.raises(ValueError):
        entropy_estimate(old, torch.zeros_like(mask))


def test_alpha_before_the_estimate_is_exact_where_alpha_does_not_depend_on_it():
    # the fused on-policy update takes alpha_k before e_k is known, then step(e_k, alpha) moves c as usual
    scripted = [0.30, 0.15, 0.10, 0.18, 0.25, 0.12, 0.20]
    for config in (
        EntropyControlConfig(timing="repository", delta=0.005),
        EntropyControlConfig(mode="fixed", fixed_coef=0.003),
        EntropyControlConfig(mode="off"),
    ):
        plain, fused = (AdaptiveEntropyController.from_config(config) for _ in range(2))
        for e in scripted:
            assert not fused.alpha_needs_estimate
            alpha = fused.alpha_before(switch_estimate=-1.0)  # a wrong estimate changes nothing here
            assert fused.step(e, alpha=alpha) == plain.step(e)
            assert fused.state_dict() == plain.state_dict()


def test_paper_timing_needs_the_estimate_once_the_coefficient_is_positive():
    ctrl = AdaptiveEntropyController.from_config(EntropyControlConfig())  # paper timing, target 0.2
    assert not ctrl.alpha_needs_estimate  # c_0 = 0: alpha_0 is 0 whatever e_0
    assert ctrl.alpha_before(0.1) == 0.0
    ctrl.step(0.1)  # below target: c_1 = 0.005
    assert ctrl.alpha_needs_estimate
    assert (ctrl.alpha_before(0.1), ctrl.alpha_before(0.3)) == (0.005, 0.0)
    # the switch read from another estimate (0.19, below) while e_1 (0.21) is above: alpha as taken, c from e_1
    assert ctrl.step(0.21, alpha=ctrl.alpha_before(0.19)) == 0.005
    assert ctrl.coef == pytest.approx(0.0) and ctrl.metrics()["entropy"] == 0.21
