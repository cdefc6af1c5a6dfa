"""Score generated samples with the training rewards and shape them for the cache and the metrics.

Scoring goes through `or1.rewards.score.score_batch`, the same function the trainer uses: math in its killable
verifier pool, code in the sandbox. The extracted math answer is normalised here so maj@k votes "025" and "25"
together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from or1.eval.generation import Completion
from or1.eval.metrics import ProblemSamples, SampleOutcome
from or1.eval.samples import SampleRecord
from or1.rewards.result import CORRECT

SCORE_TIMEOUT = {"math": 5.0, "code": 6.0}  # the paper: 5 s math verification, 6 s per code test


def score_completions(
    units: Sequence[tuple[dict[str, Any], str, int]],
    completions: Sequence[Completion],
    *,
    workers: int,
    timeout: float | None = None,
) -> list[SampleRecord]:
    """Score each (row, problem_id, sample_index) unit's completion; one SampleRecord per unit, in order."""
    from or1.rewards.normalize import normalize_answer
    from or1.rewards.score import score_batch

    rows = [{**row, "response": c.text} for (row, _, _), c in zip(units, completions, strict=True)]
    abilities = {row["ability"] for row in rows}
    limit = timeout if timeout is not None else max(SCORE_TIMEOUT[a] for a in abilities) if abilities else 5.0
    results = score_batch(rows, workers=workers, timeout=limit) if rows else []
    records = []
    for (row, problem_id, index), completion, result in zip(units, completions, results, strict=True):
        answer = None
        if row["ability"] == "math" and result.extracted is not None:
            answer = normalize_answer(result.extracted)
        records.append(
            SampleRecord(
                problem_id=problem_id,
                sample_index=index,
                response=completion.text,
                num_tokens=completion.num_tokens,
                truncated=completion.truncated,
                score=float(result.score),
                reason=result.reason,
                extracted=result.extracted,
                answer=answer,
                detail=result.detail,
            )
        )
    return records


def outcome(record: SampleRecord) -> SampleOutcome:
    """What the metrics need of one record. Correct means the verifier said so (code: all tests passed)."""
    return SampleOutcome(
        correct=record.reason == CORRECT,
        answer=record.answer,
        num_tokens=record.num_tokens,
        truncated=record.truncated,
    )


def group_problems(
    problem_ids: Sequence[str], records: Sequence[SampleRecord], n: int
) -> list[ProblemSamples]:
    """The first n samples of each problem, in problem order; every problem must have all n."""
    by_key = {(r.problem_id, r.sample_index): r for r in records}
    problems = []
    for pid in problem_ids:
        missing = [i for i in range(n) if (pid, i) not in by_key]
        if missing:
            raise ValueError(f"problem {pid} lacks samples {missing[:5]}")
        problems.append(ProblemSamples(pid, [outcome(by_key[(pid, i)]) for i in range(n)]))
    return problems
