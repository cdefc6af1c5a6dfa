"""Shared benchmark rows judged by the real rewards: code in the sandbox (both test forms), AIME golds as integers."""

from __future__ import annotations

import pytest

from or1.data.benchmarks import benchmark_folder, load_benchmark
from or1.eval.evaluate import problem_id
from or1.eval.generation import Completion
from or1.eval.grading import group_problems, score_completions
from or1.eval.metrics import Metrics, compute_metrics
from or1.eval.samples import SampleRecord

BENCHMARKS = benchmark_folder()

pytestmark = pytest.mark.skipif(
    BENCHMARKS is None or not BENCHMARKS.is_dir(),
    reason="no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)",
)

STDIN_SOLUTION = """```python
n = int(input())
a = list(map(int, input().split()))
print(a.index(sorted(a)[-2]) + 1)
```"""

CALL_SOLUTION = """```python
from collections import deque
from typing import List


class Solution:
    def shortestDistanceAfterQueries(self, n: int, queries: List[List[int]]) -> List[int]:
        edges = [[i + 1] for i in range(n - 1)] + [[]]
        answers = []
        for u, v in queries:
            edges[u].append(v)
            dist = [0] + [-1] * (n - 1)
            queue = deque([0])
            while queue:
                x = queue.popleft()
                for y in edges[x]:
                    if dist[y] < 0:
                        dist[y] = dist[x] + 1
                        queue.append(y)
            answers.append(dist[-1])
        return answers
```"""


def judge(rows: list[dict], responses: list[list[str]], workers: int) -> tuple[list[SampleRecord], Metrics]:
    """Score n responses per row and compute the metrics, as `or1 eval` does after sampling."""
    n = len(responses[0])
    ids = [problem_id(i, row) for i, row in enumerate(rows)]
    units = [(row, pid, k) for pid, row in zip(ids, rows, strict=True) for k in range(n)]
    records = score_completions(
        units, [Completion(t, 0, False) for o in responses for t in o], workers=workers
    )
    math_only = all(row["ability"] == "math" for row in rows)
    return records, compute_metrics(group_problems(ids, records, n), seed=0, with_majority=math_only)


def test_public_tests_accept_right_programs_and_reject_wrong_ones() -> None:
    rows = load_benchmark("livecodebench").rows
    stdin_row = rows[0]  # "which element is the second largest": stdin/stdout tests
    call_row = next(
        r for r in rows if '"fn_name": "shortestDistanceAfterQueries"' in r["reward_model"]["ground_truth"]
    )
    responses = [[STDIN_SOLUTION, "```python\nprint(1)\n```"], [CALL_SOLUTION, "I cannot solve it."]]
    records, metrics = judge([stdin_row, call_row], responses, workers=2)
    assert [r.reason for r in records] == ["correct", "wrong_output", "correct", "no_code"]
    assert metrics.estimates["avg@2"].value == pytest.approx(0.5)
    assert metrics.estimates["pass@1"].value == pytest.approx(0.5)  # c/n, = avg@2
    assert metrics.estimates["first@1"].value == 1.0  # both first samples are right
    assert "maj@2" not in metrics.estimates


def test_aime_zero_padded_golds_and_majority_votes_compare_as_integers() -> None:
    row = load_benchmark("aime24").rows[1]  # gold "025"
    responses = [["\\boxed{25}", "\\boxed{025}", "\\boxed{24}", "the answer is 25"]]
    records, metrics = judge([row], responses, workers=1)
    assert [r.reason for r in records] == ["correct", "correct", "wrong_answer", "correct"]
    assert {r.answer for r in records} == {"25", "24"}  # "025" votes with "25"
    assert metrics.estimates["maj@4"].value == 1.0
