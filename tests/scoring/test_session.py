"""Scoring sessions on the head: rows submitted while the caller works, every row scored once at finish, a hung
verifier scored timeout while the rest of the batch goes on, the per-row seconds and nodes in the step's metrics and
saved samples."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from hang_verifier import verify_or_hang

import or1.rewards.score
from or1.config.schema import RewardConfig
from or1.data.synthetic import math_validation_rows
from or1.hybrid.batch import Batch
from or1.hybrid.columns import SCORE_NODE, SCORE_SECONDS
from or1.scoring import RewardManager
from or1.trainer.phases import scoring_metrics
from or1.trainer.step_log import write_step_samples


def math_rows(count: int) -> list[dict]:
    """`count` math rows, the even ones answered right and the odd ones wrong."""
    rows = []
    for i, row in enumerate(math_validation_rows()[:count]):
        response = row["extra_info"]["solution"] if i % 2 == 0 else "\\boxed{1000}"
        rows.append({"ability": "math", "response": response, "reward_model": dict(row["reward_model"])})
    return rows


def test_rows_submitted_in_parts_are_each_scored_once_as_compute_scores_would() -> None:
    manager = RewardManager(RewardConfig(workers=1))
    rows = math_rows(6)
    session = manager.session()
    session.submit(["a", "b"], rows[:2])
    session.submit(["c", "d", "e", "f"], rows[2:])
    with pytest.raises(ValueError, match="submitted twice"):
        session.submit(["a"], rows[:1])
    scored = session.finish()
    assert [scored.results[k].score for k in "abcdef"] == [1.0, 0.0] * 3
    assert scored.node_rows == {"head": 6}
    assert scored.busy_seconds >= 0 and scored.exposed_seconds >= 0
    batch = Batch.from_dict(
        {
            "ability": [r["ability"] for r in rows],
            "response_text": [r["response"] for r in rows],
            "reward_model": [r["reward_model"] for r in rows],
        }
    )
    whole = manager.compute_scores(batch)
    assert whole.tensors["scores"].tolist() == [scored.results[k].score for k in "abcdef"]
    assert list(whole.non_tensor[SCORE_NODE]) == ["head"] * 6 and len(whole.non_tensor[SCORE_SECONDS]) == 6
    manager.close()


def test_a_hung_verifier_is_killed_and_scored_timeout_while_the_batch_goes_on(monkeypatch) -> None:
    monkeypatch.setattr(or1.rewards.score, "verify_math", verify_or_hang)
    decide = or1.rewards.score.prejudge  # the pool only sees rows that string work cannot decide
    monkeypatch.setattr(
        or1.rewards.score, "prejudge", lambda r, g, e: None if "HANG" in r else decide(r, g, e)
    )
    manager = RewardManager(RewardConfig(workers=1, math_timeout=1.0))
    rows = math_rows(4)
    rows[1] = {**rows[1], "response": "HANG \\boxed{x^2}"}
    start = time.monotonic()
    session = manager.session()
    session.submit(range(4), rows)
    scored = session.finish()
    assert time.monotonic() - start < 60
    assert [(scored.results[i].score, scored.results[i].reason) for i in range(4)] == [
        (1.0, "correct"),
        (0.0, "timeout"),
        (1.0, "correct"),
        (0.0, "wrong_answer"),
    ]
    manager.close()


def test_the_slowest_rows_go_into_the_metrics_and_the_saved_samples(tmp_path: Path) -> None:
    seconds = [0.1, 0.0, 7.5, 0.3, 4.0, 0.2]  # row 1 was decided without running a verifier
    batch = Batch.from_dict(
        {
            "ability": ["math", "math", "code", "math", "code", "math"],
            "score_reason": ["correct", "wrong_answer", "timeout", "correct", "correct", "correct"],
            "score_seconds": seconds,
            "score_node": ["ab12cd34", "ab12cd34", "ef56ab78", "ef56ab78", "ab12cd34", "ab12cd34"],
            "response_text": [f"r{i}" for i in range(6)],
        }
    )
    metrics = scoring_metrics(batch)
    assert metrics["reward/rows_node_ab12cd34"] == 4 and metrics["reward/rows_node_ef56ab78"] == 2
    assert metrics["time/reward_slowest_row"] == 7.5
    assert metrics["perf/reward_slowest_rows"] == "7.5s code timeout; 4.0s code correct; 0.3s math correct"
    path = write_step_samples(tmp_path, 3, batch, 2)
    saved = [json.loads(line) for line in path.read_text().splitlines()]
    # the first two rows, then the slowest ones not among them
    assert [s["response"] for s in saved] == ["r0", "r1", "r2", "r4", "r3"]
    assert [s["score_seconds"] for s in saved] == [0.1, 0.0, 7.5, 4.0, 0.3]
    assert [s.get("slowest", False) for s in saved] == [False, False, True, True, True]
    assert saved[2]["score_node"] == "ef56ab78"
