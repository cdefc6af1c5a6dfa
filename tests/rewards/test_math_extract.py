"""Finding the final answer: only after the last </think>, last complete box, else an explicit statement."""

from __future__ import annotations

import pytest

from or1.rewards.extract import AnswerTooComplex, extract_answer, final_region
from or1.rewards.math import verify_math


def test_only_text_after_last_think_is_graded() -> None:
    response = "<think>maybe \\boxed{7}</think> hmm </think> so the answer is \\boxed{8}"
    assert final_region(response) == " so the answer is \\boxed{8}"
    assert verify_math(response, '["8"]').correct
    assert not verify_math(response, '["7"]').correct


def test_box_inside_thinking_only_is_no_answer() -> None:
    result = verify_math("<think>I get \\boxed{7}</think>I am not sure.", '["7"]')
    assert (result.score, result.reason) == (0.0, "no_answer")


def test_without_think_tag_the_whole_text_counts() -> None:
    assert verify_math("We compute ... \\boxed{12}.", '["12"]').correct


def test_last_box_wins_and_braces_balance() -> None:
    found = extract_answer("\\boxed{1} then \\boxed{\\frac{1}{\\sqrt{2}}} done")
    assert found is not None and found.answer == "\\frac{1}{\\sqrt{2}}" and found.kind == "boxed"


def test_fbox_and_escaped_set_braces() -> None:
    assert extract_answer("\\fbox{5}").answer == "5"
    assert extract_answer("\\boxed{\\{1, 2\\}}").answer == "\\{1, 2\\}"


def test_unclosed_last_box_falls_back_to_earlier_complete_box() -> None:
    assert extract_answer("\\boxed{41} and finally \\boxed{4").answer == "41"


@pytest.mark.parametrize(
    "response,answer",
    [
        ("So the final answer is 34.", "34"),
        ("Final Answer: The final answer is $28\\%$. I hope it is correct.", "28\\%"),
        ("**Answer:** $\\frac{3}{4}$", "\\frac{3}{4}"),
        ("Answer: 17\nThanks", "17"),
    ],
)
def test_answer_statements(response: str, answer: str) -> None:
    found = extract_answer(response)
    assert found is not None and found.kind == "statement" and found.answer == answer


def test_no_box_and_no_statement_is_no_answer() -> None:
    assert extract_answer("I computed 5 then 6 and stopped") is None
    assert verify_math("I computed 5 then 6", '["6"]').reason == "no_answer"
    assert verify_math("\\boxed{}", '["6"]').reason == "no_answer"


def test_oversized_box_is_too_complex() -> None:
    with pytest.raises(AnswerTooComplex):
        extract_answer("\\boxed{" + "1" * 5000 + "}")
