"""Hostile responses: each scores 0 within the timeout and the rest of the batch is still scored."""

from __future__ import annotations

import json
import time

import pytest

from or1.rewards.score import score_batch

TIMEOUT = 3.0
SLACK = 4.0  # process replacement and IPC on a busy 2-core machine


def _row(response: str, gold: str = "42") -> dict:
    return {"ability": "math", "response": response, "reward_model": {"ground_truth": json.dumps([gold])}}


HOSTILE = {
    "5 MB response": "The answer is near " + "1+" * 2_500_000 + "1",
    "power tower": "\\boxed{9^{9^{9^{9}}}}",
    "nested frac": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
    "unclosed box then megabytes": "\\boxed{" + "7" * 3_000_000,
    "20000 boxes": "\\boxed{}" * 20_000,
    "20000 full boxes": "\\boxed{41}" * 20_000,
    "NUL bytes": "\x00" * 10_000 + "\\boxed{\x00\x00}",
    "huge sum": "\\boxed{\\sum_{k=1}^{10^{9}} k^{k}}",
    "huge integer": "\\boxed{" + "9" * 900 + "}",
}


@pytest.fixture(scope="module", autouse=True)
def _warm_pool() -> None:
    """Start the shared pool first: its one-off start-up is not part of any verification's time."""
    assert score_batch([_row("\\boxed{\\frac{84}{2}}")], timeout=60.0)[0].correct


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_response_scores_zero_within_the_timeout(name: str) -> None:
    started = time.monotonic()
    result = score_batch([_row(HOSTILE[name])], timeout=TIMEOUT)[0]
    assert time.monotonic() - started < TIMEOUT + SLACK
    assert result.score == 0.0 and result.reason in {"wrong_answer", "no_answer", "timeout"}


def test_hostile_rows_do_not_spoil_the_batch() -> None:
    rows = [_row(text) for text in HOSTILE.values()]
    rows.insert(3, _row("\\boxed{\\frac{84}{2}}"))
    rows.append(_row("<think>hmm</think>\\boxed{42}"))
    started = time.monotonic()
    results = score_batch(rows, timeout=TIMEOUT)
    assert time.monotonic() - started < 2 * (TIMEOUT + SLACK)  # at most a couple of timeouts in parallel
    assert [r.correct for r in results] == [False] * 3 + [True] + [False] * (len(HOSTILE) - 3) + [True]
