"""score_batch: ordered results, dispatch by ability, malformed rows as bad_input."""

from __future__ import annotations

import json
import sys
import types

import pytest

from or1.rewards.result import Result
from or1.rewards.score import score_batch


def _row(response: object, gold: str = "42", ability: str = "math") -> dict:
    return {"ability": ability, "response": response, "reward_model": {"ground_truth": json.dumps([gold])}}


def test_results_are_ordered_and_mix_fast_and_pool_paths() -> None:
    rows = [
        _row("\\boxed{42}"),
        _row("\\boxed{\\frac{84}{2}}"),
        _row("\\boxed{41}"),
        _row("\\boxed{\\sqrt{1764}}"),
    ]
    assert [r.reason for r in score_batch(rows)] == ["correct", "correct", "wrong_answer", "correct"]


def test_reward_model_may_be_a_json_string() -> None:
    row = {"ability": "math", "response": "\\boxed{7}", "reward_model": json.dumps({"ground_truth": '["7"]'})}
    assert score_batch([row])[0].correct


@pytest.mark.parametrize(
    "row",
    [
        {"ability": "math", "response": "\\boxed{1}"},
        {"ability": "math", "response": 5, "reward_model": {"ground_truth": '["5"]'}},
        {"ability": "poetry", "response": "\\boxed{1}", "reward_model": {"ground_truth": '["1"]'}},
        {"ability": "math", "response": "\\boxed{1}", "reward_model": "{not json"},
        {"ability": "math", "response": "\\boxed{1}", "reward_model": {"ground_truth": "[]"}},
        "not a row",
    ],
)
def test_malformed_row_is_bad_input_and_the_batch_goes_on(row: object) -> None:
    results = score_batch([row, _row("\\boxed{42}")])  # type: ignore[list-item]
    assert (results[0].score, results[0].reason) == (0.0, "bad_input")
    assert results[1].correct


def test_code_rows_go_to_the_code_reward(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_score_code_batch(responses, ground_truths, *, slots, timeout):  # noqa: ANN001
        calls.append((responses, ground_truths, slots, timeout))
        return [Result(1.0, "correct", extracted=r) for r in responses]

    fake = types.ModuleType("or1.rewards.code")
    fake.score_code_batch = fake_score_code_batch  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "or1.rewards.code", fake)
    rows = [
        _row("print(1)", '{"inputs": [], "outputs": []}', "code"),
        _row("\\boxed{42}"),
        _row("x", "y", "code"),
    ]
    results = score_batch(rows, workers=2, timeout=4.0, code_timeout=6.0)
    assert [r.extracted for r in results] == ["print(1)", "42", "x"]
    assert calls == [
        (["print(1)", "x"], [json.dumps(['{"inputs": [], "outputs": []}']), json.dumps(["y"])], 2, 6.0)
    ]
    score_batch(rows[:1])
    assert calls[-1][3] is None  # the code reward's own per-test default


def test_code_rows_without_a_code_reward_are_internal_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "or1.rewards.code", None)  # makes the import fail
    result = score_batch([_row("print(1)", "{}", "code")])[0]
    assert (result.score, result.reason, result.detail) == (0.0, "internal_error", "code reward unavailable")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        score_batch([], workers=0)
    assert score_batch([]) == []


def test_math_extraction_setting_reaches_the_verifier() -> None:
    from or1.config.schema import RewardConfig

    row = {
        "ability": "math",
        "response": "<think>x</think>So it is $\\frac{1}{2}$.",
        "reward_model": {"ground_truth": '["0.5"]'},
    }
    assert RewardConfig().math_extraction == "math_verify"  # the default follows Skywork-OR1
    assert score_batch([row])[0].correct
    assert score_batch([row], math_extraction="statement")[0].reason == "no_answer"
    with pytest.raises(ValueError, match="math_extraction"):
        score_batch([row], math_extraction="loose")


def test_seconds_is_the_verifier_time_and_not_part_of_the_verdict() -> None:
    prejudged, pooled = score_batch([_row("\\boxed{42}"), _row("\\boxed{\\sqrt{1764}}")])
    assert prejudged.seconds == 0.0  # decided by string work here, nothing ran
    assert pooled.correct and pooled.seconds > 0.0
    assert Result(1.0, "correct", seconds=0.5) == Result(1.0, "correct")
