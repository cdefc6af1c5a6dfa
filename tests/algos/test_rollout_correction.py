"""Sampler / trainer mismatch metrics and verl's rollout correction (TIS, MIS), by hand and by the published formulas."""

import math

import pytest
import torch

from or1.algos.rollout_correction import CorrectionSettings, correct, mismatch_metrics

# Two responses: row 0 has 3 tokens, row 1 has 2 (and one padding position with a NaN log-prob).
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, float("nan")]])
ROLLOUT = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LOG_RHO = [[0.5, -1.0, 0.0], [0.1, -2.0]]  # log pi_old - log pi_sampler on the loss tokens


def test_mismatch_metrics_by_hand_and_per_group():
    m = mismatch_metrics(OLD, ROLLOUT, MASK, threshold=2.0, groups=["math", "code"])
    flat = [x for row in LOG_RHO for x in row]
    assert m["abs_diff_mean"] == pytest.approx(sum(abs(x) for x in flat) / 5)
    assert m["abs_diff_max"] == pytest.approx(2.0)
    assert m["k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in flat) / 5)
    assert m["past_threshold_frac"] == pytest.approx(2 / 5)  # |log rho| > log 2: -1.0 and -2.0
    assert m["math/abs_diff_mean"] == pytest.approx(1.5 / 3) and m["code/abs_diff_max"] == pytest.approx(2.0)
    assert math.isfinite(m["code/k3_kl"])  # the NaN at the padding position stays out


def test_matched_sampler_reads_zero():
    m = mismatch_metrics(OLD, torch.nan_to_num(OLD), MASK, threshold=2.0)
    assert m == {"abs_diff_mean": 0.0, "abs_diff_max": 0.0, "k3_kl": 0.0, "past_threshold_frac": 0.0}


def test_mismatch_metrics_do_not_bound_the_log_ratio():
    # a broken weights push: the trainer gives one sampled token log-prob -40 where the sampler gave -5, log rho -35
    old, rollout, mask = torch.tensor([[-40.0, -1.0]]), torch.tensor([[-5.0, -1.0]]), torch.tensor([[1, 1]])
    m = mismatch_metrics(old, rollout, mask, threshold=2.0)
    assert m["abs_diff_max"] == 35.0 and m["abs_diff_mean"] == 17.5  # not 20 and 10
    assert m["k3_kl"] == pytest.approx((math.exp(-35.0) - 1 + 35.0) / 2)  # 17.0, not (e^-20 + 19) / 2 = 9.5
    # rho = e^30: its k3 is e^30 - 31 = 1.07e13, beyond what a bound at 20 (e^20 - 21 = 4.9e8) could read
    up = mismatch_metrics(torch.tensor([[-1.0]]), torch.tensor([[-31.0]]), torch.tensor([[1]]), threshold=2.0)
    assert up["k3_kl"] == pytest.approx(math.exp(30.0) - 31.0, rel=1e-9)


def test_token_tis_truncates_each_ratio_at_the_cap():
    weights, mask, m = correct(OLD, ROLLOUT, MASK, CorrectionSettings(is_level="token", is_cap=1.5))
    expected = [[min(math.exp(x), 1.5) for x in row] for row in LOG_RHO]
    torch.testing.assert_close(weights[0], torch.tensor(expected[0]))
    torch.testing.assert_close(weights[1, :2], torch.tensor(expected[1]))
    assert weights[1, 2] == 0 and torch.equal(mask, MASK)
    assert m["is_truncated_frac"] == pytest.approx(1 / 5)  # only e^0.5 = 1.65 > 1.5
    # the weights as they multiply the loss, and the ratios before truncation
    assert m["is_weight_mean"] == pytest.approx((1.5 + math.exp(-1) + 1 + math.exp(0.1) + math.exp(-2)) / 5)
    assert m["is_weight_max"] == pytest.approx(1.5)
    assert m["is_ratio_mean"] == pytest.approx(
        (math.exp(0.5) + math.exp(-1) + 1 + math.exp(0.1) + math.exp(-2)) / 5
    )
    assert m["is_ratio_max"] == pytest.approx(math.exp(0.5))


def test_sequence_tis_weighs_a_response_by_its_product_of_ratios():
    weights, _, _ = correct(OLD, ROLLOUT, MASK, CorrectionSettings(is_level="sequence", is_cap=2.0))
    # published form (verl's sequence-level IS): w_i = min(prod_t rho_it, C) on every token of response i
    for i, row in enumerate(LOG_RHO):
        w = min(math.prod(math.exp(x) for x in row), 2.0)
        assert weights[i, : len(row)].tolist() == pytest.approx([w] * len(row))


def test_sequence_ratio_metrics_see_past_the_cap_and_the_bound():
    # one response of two tokens, log rho 15 each: the product e^30 is bounded to e^20 and truncated at 10 in the
    # weights; the ratio metrics report it as it is, on both of its tokens
    old, rollout, mask = torch.tensor([[-1.0, -2.0]]), torch.tensor([[-16.0, -17.0]]), torch.tensor([[1, 1]])
    weights, _, m = correct(old, rollout, mask, CorrectionSettings(is_level="sequence", is_cap=10.0))
    assert weights.tolist() == [[10.0, 10.0]]
    assert (m["is_weight_mean"], m["is_weight_max"], m["is_truncated_frac"]) == (10.0, 10.0, 1.0)
    assert m["is_ratio_mean"] == pytest.approx(math.exp(30.0), rel=1e-9)
    assert m["is_ratio_max"] == pytest.approx(math.exp(30.0), rel=1e-9)


@pytest.mark.parametrize(
    ("level", "kept_rows"),
    [
        ("sequence", [True, False]),  # log prod: -0.5 (inside [-log 2, log 2]) and -1.9 (outside)
        ("geometric", [True, False]),  # log geometric mean: -0.167 and -0.95
    ],
)
def test_sequence_rejection_masks_whole_responses(level, kept_rows):
    _, mask, m = correct(OLD, ROLLOUT, MASK, CorrectionSettings(rejection=level, rejection_upper=2.0))
    for i, kept in enumerate(kept_rows):
        assert bool(mask[i].any()) is kept
    assert m["rejected_seq_frac"] == pytest.approx(0.5) and m["rejected_token_frac"] == pytest.approx(2 / 5)


def test_geometric_rejection_is_tighter_than_it_looks():
    # bounds [0.9, 1.2] on the geometric mean: row 0's exp(-0.5 / 3) = 0.846 is out, as is row 1's
    _, mask, _ = correct(
        OLD,
        ROLLOUT,
        MASK,
        CorrectionSettings(rejection="geometric", rejection_upper=1.2, rejection_lower=0.9),
    )
    assert not mask.any()


def test_token_rejection_then_tis_on_the_kept_tokens():
    settings = CorrectionSettings(is_level="token", is_cap=5.0, rejection="token", rejection_upper=2.0)
    weights, mask, m = correct(OLD, ROLLOUT, MASK, settings)
    assert mask.tolist() == [[1, 0, 1], [1, 0, 0]]  # rho e^-1 and e^-2 are below 1/2
    assert weights[0, 1] == 0 and weights[0, 0] == pytest.approx(math.exp(0.5))
    assert m["rejected_token_frac"] == pytest.approx(2 / 5)
    assert m["rejected_seq_frac"] == 1.0  # each response lost a token, though neither lost all of them
    # the weights over the 3 kept tokens; the ratios over all 5 loss tokens, the rejected ones too
    assert m["is_weight_mean"] == pytest.approx((math.exp(0.5) + 1 + math.exp(0.1)) / 3)
    assert m["is_ratio_mean"] == pytest.approx(
        (math.exp(0.5) + math.exp(-1) + 1 + math.exp(0.1) + math.exp(-2)) / 5
    )


def test_token_rejection_counts_a_response_that_lost_any_token():
    # bounds [1/5, 5]: only row 1's rho e^-2 = 0.135 is out, one of its two tokens
    _, mask, m = correct(OLD, ROLLOUT, MASK, CorrectionSettings(rejection="token", rejection_upper=5.0))
    assert mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert m["rejected_token_frac"] == pytest.approx(1 / 5) and m["rejected_seq_frac"] == pytest.approx(1 / 2)


def test_settings_off_by_default():
    assert not CorrectionSettings().enabled and CorrectionSettings(rejection_upper=4.0).lower == 0.25
