"""Evaluation statistics over scored samples: avg@n, unbiased pass@k, first@1, maj@k, bootstrap intervals.

Everything here is pure (no model, no files): a `ProblemSamples` holds one problem's samples in sample-index order,
and `compute_metrics` turns a list of them into a `Metrics` summary that report.py writes. Conventions (those of
DeepSeek-R1, Skywork-OR1 and HumanEval's estimator): avg@n is the mean over problems of (correct samples / n);
pass@k is the unbiased estimator 1 - C(n-c, k) / C(n, k) over the n samples actually drawn, so pass@1 = c / n,
the same number as avg@n; first@1 is the first sample alone (one try per problem); maj@k is majority voting
over the first k samples (see `majority_correct` for answerless samples and ties).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

CI_RESAMPLES = 1000  # enough for a stable 95% percentile interval over 30-500 problems, and cheap
CI_LEVEL = 0.95


@dataclass(frozen=True)
class SampleOutcome:
    """One scored sample: correctness, the answer the verifier extracted (for maj@k), length and truncation."""

    correct: bool
    answer: str | None = None  # the normalised extracted answer; None when the response states none
    num_tokens: int = 0
    truncated: bool = False


@dataclass(frozen=True)
class ProblemSamples:
    """The samples of one problem, in sample-index order (index 0 is "the first sample" of first@1)."""

    problem_id: str
    samples: Sequence[SampleOutcome]

    @property
    def num_correct(self) -> int:
        return sum(s.correct for s in self.samples)


@dataclass(frozen=True)
class Estimate:
    """A metric's value over problems with its bootstrap confidence interval (both as fractions in [0, 1])."""

    value: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class ProblemRow:
    """One line of the per-problem table."""

    problem_id: str
    num_samples: int
    num_correct: int
    mean_tokens: float
    truncation_rate: float


@dataclass
class Metrics:
    """Headline estimates keyed by name (`avg@32`, `pass@1`, `pass@8`, `first@1`, `maj@32`, ...) and the table."""

    num_problems: int
    samples_per_problem: int
    estimates: dict[str, Estimate] = field(default_factory=dict)
    mean_tokens: float = 0.0
    truncation_rate: float = 0.0
    problems: list[ProblemRow] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased estimate of P(at least one of k samples is correct) from n samples with c correct (k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # The product form of 1 - C(n-c, k) / C(n, k) stays exact-enough and never builds huge binomials.
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def avg_at_k(problem: ProblemSamples) -> float:
    """Fraction of this problem's samples that are correct (averaged over problems it is avg@k)."""
    return problem.num_correct / len(problem.samples)


def first_sample(problem: ProblemSamples) -> float:
    """first@1: 1.0 when the first sample is correct (one try per problem; noisier than pass@1 = c / n)."""
    return float(problem.samples[0].correct)


def majority_correct(problem: ProblemSamples, k: int) -> float:
    """maj@k: 1.0 when the most common extracted answer among the first k samples is a correct one.

    Samples without an answer do not vote; a tie goes to the answer that appeared first, so the result does not
    depend on dict order; an answer counts as correct when any sample giving it was judged correct.
    """
    votes: dict[str, int] = {}
    right: dict[str, bool] = {}
    for sample in problem.samples[:k]:
        if sample.answer is None:
            continue
        votes[sample.answer] = votes.get(sample.answer, 0) + 1  # insertion order = first appearance
        right[sample.answer] = right.get(sample.answer, False) or sample.correct
    if not votes:
        return 0.0
    top = max(votes.values())
    winner = next(answer for answer, count in votes.items() if count == top)
    return float(right[winner])


def bootstrap_ci(
    values: Sequence[float], *, seed: int, resamples: int = CI_RESAMPLES, level: float = CI_LEVEL
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem `values` (resampling problems), seeded."""
    if not values:
        return (0.0, 0.0)
    data = np.asarray(values, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(data), size=(resamples, len(data)))
    means = data[picks].mean(axis=1)
    tail = (1.0 - level) / 2
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return (float(low), float(high))


def _estimate(per_problem: list[float], seed: int) -> Estimate:
    low, high = bootstrap_ci(per_problem, seed=seed)
    return Estimate(value=sum(per_problem) / len(per_problem), ci_low=low, ci_high=high)


def default_ks(n: int) -> list[int]:
    """The k values reported for n samples: powers of two up to n, and n itself."""
    ks = [k for k in (1, 2, 4, 8, 16, 32, 64, 128, 256) if k <= n]
    return ks if n in ks else [*ks, n]


def compute_metrics(
    problems: Sequence[ProblemSamples], *, seed: int, with_majority: bool, ks: Sequence[int] | None = None
) -> Metrics:
    """All headline metrics over `problems`; every problem must have the same number of samples n >= 1."""
    if not problems:
        raise ValueError("compute_metrics needs at least one problem")
    n = len(problems[0].samples)
    if n == 0 or any(len(p.samples) != n for p in problems):
        raise ValueError("every problem needs the same, non-zero number of samples")
    ks = sorted(set(ks or default_ks(n)))
    per_metric: dict[str, Callable[[ProblemSamples], float]] = {f"avg@{n}": avg_at_k}
    for k in [k for k in ks if 1 <= k <= n]:
        per_metric[f"pass@{k}"] = lambda p, k=k: pass_at_k(n, p.num_correct, k)
    per_metric["first@1"] = first_sample
    multi = [k for k in ks if 1 < k <= n]
    if with_majority:
        for k in multi:
            per_metric[f"maj@{k}"] = lambda p, k=k: majority_correct(p, k)
    estimates = {name: _estimate([fn(p) for p in problems], seed) for name, fn in per_metric.items()}
    samples = [s for p in problems for s in p.samples]
    return Metrics(
        num_problems=len(problems),
        samples_per_problem=n,
        estimates=estimates,
        mean_tokens=sum(s.num_tokens for s in samples) / len(samples),
        truncation_rate=sum(s.truncated for s in samples) / len(samples),
        problems=[_problem_row(p) for p in problems],
    )


def _problem_row(problem: ProblemSamples) -> ProblemRow:
    count = len(problem.samples)
    return ProblemRow(
        problem_id=problem.problem_id,
        num_samples=count,
        num_correct=problem.num_correct,
        mean_tokens=sum(s.num_tokens for s in problem.samples) / count,
        truncation_rate=sum(s.truncated for s in problem.samples) / count,
    )
