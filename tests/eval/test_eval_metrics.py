"""Evaluation metrics against hand-computed values and the closed forms they estimate."""

from __future__ import annotations

from math import comb

import pytest

from or1.eval.metrics import (
    ProblemSamples,
    SampleOutcome,
    bootstrap_ci,
    compute_metrics,
    default_ks,
    majority_correct,
    pass_at_k,
)


def problem(
    pid: str, correct: list[int], answers: list[str | None] | None = None, tokens: int = 10
) -> ProblemSamples:
    answers = answers or [None] * len(correct)
    return ProblemSamples(
        pid, [SampleOutcome(bool(c), a, tokens, False) for c, a in zip(correct, answers, strict=True)]
    )


def test_pass_at_k_matches_the_closed_form_for_every_small_case() -> None:
    for n in range(1, 11):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - comb(n - c, k) / comb(n, k), abs=1e-12)


def test_pass_at_k_hand_values() -> None:
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(0.9)  # 1 - C(3,3)/C(5,3) = 1 - 1/10
    assert pass_at_k(32, 0, 8) == 0.0
    assert pass_at_k(8, 5, 4) == 1.0  # only 3 wrong samples: any 4 include a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)  # k=1 is the correct fraction


def test_pass_at_k_rejects_k_above_n() -> None:
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_avg_pass1_and_pass_k_over_problems() -> None:
    problems = [problem("a", [1, 0, 1, 1]), problem("b", [0, 0, 0, 0]), problem("c", [0, 1, 0, 0])]
    metrics = compute_metrics(problems, seed=0, with_majority=False, ks=[1, 2, 4])
    est = metrics.estimates
    assert est["avg@4"].value == pytest.approx((0.75 + 0 + 0.25) / 3)
    # pass@1 is HumanEval's unbiased estimator at k=1, c/n per problem, as DeepSeek-R1 and Skywork-OR1 report it:
    # (3/4 + 0/4 + 1/4) / 3, the same number as avg@4
    assert est["pass@1"].value == pytest.approx((0.75 + 0 + 0.25) / 3)
    assert est["pass@1"].value == pytest.approx(est["avg@4"].value)
    assert est["first@1"].value == pytest.approx(1 / 3)  # only problem a's first sample is right
    assert est["pass@2"].value == pytest.approx((1.0 + 0.0 + 0.5) / 3)  # c: 1 - C(3,2)/C(4,2)
    assert est["pass@4"].value == pytest.approx(2 / 3)
    assert "maj@4" not in est
    assert [row.num_correct for row in metrics.problems] == [3, 0, 1]


def test_majority_vote_ties_go_to_the_first_answer_and_blanks_do_not_vote() -> None:
    tie = problem("t", [1, 0, 0, 1], ["5", "7", "7", "5"])
    assert majority_correct(tie, 4) == 1.0  # 2-2 tie: "5" appeared first
    assert majority_correct(tie, 3) == 0.0  # "7" leads 2-1 among the first three
    later_tie = problem("u", [0, 1, 1, 0], ["7", "5", "5", "7"])
    assert majority_correct(later_tie, 4) == 0.0  # the tie goes to "7", which appeared first
    blanks = problem("b", [0, 0, 1], [None, None, "3"])
    assert majority_correct(blanks, 3) == 1.0
    assert majority_correct(problem("n", [0, 0], [None, None]), 2) == 0.0


def test_majority_answer_counts_as_correct_when_any_of_its_samples_was_judged_correct() -> None:
    # "1/2" and "0.5" normalise differently but the verifier judged both: the winner is the answer string
    mixed = problem("m", [0, 1, 0], ["1/2", "1/2", "3"])
    assert majority_correct(mixed, 3) == 1.0


def test_maj_metric_is_reported_for_math() -> None:
    problems = [
        problem("a", [1, 0, 0, 1], ["5", "7", "7", "5"]),
        problem("b", [0, 0, 1, 0], ["2", "2", "9", "4"]),
    ]
    est = compute_metrics(problems, seed=0, with_majority=True).estimates
    assert est["maj@4"].value == pytest.approx(0.5)
    assert est["maj@2"].value == pytest.approx(0.5)  # a: tie 5/7 -> "5" correct; b: "2" wrong


def test_bootstrap_interval_is_seeded_and_brackets_the_mean() -> None:
    values = [
        (i * 37 % 11) / 11 + (i % 3) / 97 for i in range(30)
    ]  # many distinct values: seeds give distinct ends
    first = bootstrap_ci(values, seed=7)
    assert bootstrap_ci(values, seed=7) == first
    assert bootstrap_ci(values, seed=8) != first
    mean = sum(values) / len(values)
    assert first[0] < mean < first[1]
    assert 0.0 <= first[0] and first[1] <= 1.0
    assert bootstrap_ci([0.5] * 6, seed=1) == (0.5, 0.5)


def test_interval_narrows_with_more_problems() -> None:
    small = bootstrap_ci([1.0, 0.0] * 5, seed=0)
    large = bootstrap_ci([1.0, 0.0] * 200, seed=0)
    assert large[1] - large[0] < (small[1] - small[0]) / 3


def test_per_problem_table_and_totals() -> None:
    samples = [SampleOutcome(True, None, 10, False), SampleOutcome(False, None, 30, True)]
    metrics = compute_metrics([ProblemSamples("p", samples)], seed=0, with_majority=False)
    row = metrics.problems[0]
    assert (row.num_samples, row.num_correct, row.mean_tokens, row.truncation_rate) == (2, 1, 20.0, 0.5)
    assert metrics.mean_tokens == 20.0 and metrics.truncation_rate == 0.5


def test_unequal_sample_counts_are_rejected() -> None:
    with pytest.raises(ValueError):
        compute_metrics([problem("a", [1, 0]), problem("b", [1])], seed=0, with_majority=False)


def test_default_ks() -> None:
    assert default_ks(32) == [1, 2, 4, 8, 16, 32]
    assert default_ks(6) == [1, 2, 4, 6]
    assert default_ks(1) == [1]


def test_report_states_the_metric_conventions() -> None:
    from or1.eval.results import render_markdown

    metrics = compute_metrics([problem("a", [1, 0], ["5", None])], seed=0, with_majority=True)
    summary = {
        "benchmark": "toy",
        "model": {"path": "/m/toy", "sha256": None},
        "sampling": {"protocol": "p", "temperature": 0.6, "top_p": 1.0, "max_tokens": 8, "seed": 0},
        "engine": "hf",
        "reasons": {"correct": 1, "no_answer": 1},
        "data": {"source": "x", "sha256": None, "date_filter": None},
        "environment": {"or1": "0"},
        "started_at": "s",
        "finished_at": "f",
        "command": "or1 eval",
    }
    text = render_markdown(summary, metrics)
    assert "| pass@1 | 50.0 |" in text and "| first@1 | 100.0 |" in text
    assert "pass@1 = c / n = avg@n" in text
    assert (
        "samples without an answer do not vote" in text
        and "tie goes to the answer that appeared first" in text
    )
