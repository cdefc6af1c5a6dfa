"""Finding the final answer after the last </think>: last box (connected boxes combined), else an explicit statement,
else math-verify's own extraction (the default, as Skywork-OR1's reward)."""

from __future__ import annotations

import json

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
    found = extract_answer("\\boxed{1} was a guess. Checking it gives \\boxed{\\frac{1}{\\sqrt{2}}} done")
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


def test_no_box_and_no_statement_is_no_answer_in_the_strict_modes() -> None:
    assert extract_answer("I computed 5 then 6 and stopped") is None
    for mode in ("statement", "boxed"):
        assert verify_math("I computed 5 then 6", '["6"]', mode).reason == "no_answer"
        assert verify_math("\\boxed{}", '["6"]', mode).reason == "no_answer"
    assert (
        verify_math("Answer: 17", '["17"]', "boxed").reason == "no_answer"
    )  # boxed: statements do not count
    assert verify_math("Answer: 17", '["17"]', "statement").correct


def skywork_reward(response: str, gold: str) -> bool:
    """Skywork-OR1's math reward, written here from its definition (SkyworkAI/Skywork-OR1,
    verl/workers/reward_manager/hf_math_verify.py): math-verify's parse of the text after </think>, a quick string
    match, then verify against the gold wrapped in a box."""
    from math_verify import parse, verify

    text = response.split("</think>")[1] if "</think>" in response else response
    parsed = parse(text, parsing_timeout=None)
    if len(parsed) < 2:
        return False
    return parsed[1] == gold or verify(parse("\\boxed{" + gold + "}", parsing_timeout=None), parsed)


# Right answers without a box or an "answer is" statement: Skywork's reward counts them, and so does or1 by default.
UNBOXED = [
    ("<think>...</think>So the total is $\\frac{1}{2}$.", "0.5", "$\\frac{1}{3}$"),
    ("<think>...</think>Therefore\n\\[ x = 42 \\]", "42", "\\[ x = 41 \\]"),
    ("<think>...</think>I computed 5 then 6", "6", "I computed 6 then 5"),
    ("The probability is \\(\\tfrac{3}{4}\\), as required.", "3/4", "It is \\(\\tfrac{4}{3}\\)."),
]


@pytest.mark.parametrize(("response", "gold", "wrong"), UNBOXED)
def test_unboxed_answers_count_as_in_skywork(response: str, gold: str, wrong: str) -> None:
    assert skywork_reward(response, gold) and not skywork_reward(wrong, gold)
    result = verify_math(response, json.dumps([gold]))
    assert result.correct, result
    assert verify_math(wrong, json.dumps([gold])).reason == "wrong_answer"
    assert verify_math(response, json.dumps([gold]), "statement").reason == "no_answer"


def test_math_verify_fallback_keeps_the_other_rules() -> None:
    assert verify_math("<think>I get \\boxed{7}</think>I am not sure.", '["7"]').reason == "no_answer"
    assert verify_math("<think>$7$</think>", '["7"]').reason == "no_answer"  # nothing after </think>
    result = verify_math("<think>x</think>It is $8$.", '["7"]')
    assert (result.reason, result.extracted) == ("wrong_answer", "8")
    assert verify_math("<think>x</think>It is 025 apples.", '["25"]').correct  # or1's AIME normalisation too


# Several boxes joined by ",", "and" or "or" are one answer, combined as math-verify combines them.
SEVERAL = [
    ("\\boxed{1}, \\boxed{2}, \\boxed{3}", "1, 2, 3", "1, 2, 3"),
    ("\\boxed{(2,2)} and \\boxed{(6,2)}", "(2,2), (6,2)", "(2,2), (6,2)"),
    ("$\\boxed{-1}$, $\\boxed{4}$", "\\{-1, 4\\}", "-1, 4"),
    ("\\boxed{1}, \\boxed{2} and \\boxed{3}", "3, 2, 1", "1, 2, 3"),
]


@pytest.mark.parametrize(("response", "gold", "answer"), SEVERAL)
def test_connected_boxes_are_combined(response: str, gold: str, answer: str) -> None:
    found = extract_answer(response)
    assert found is not None and (found.kind, found.answer) == ("boxes", answer)
    assert skywork_reward(response, gold)
    assert verify_math(response, json.dumps([gold])).correct
    assert not verify_math(
        response, json.dumps([gold.split(",")[0].strip("\\{ ")])
    ).correct  # one of them is not the set


def test_boxes_apart_keep_the_last_box_and_repeats_count_once() -> None:
    # math-verify's rule: boxes join when < 10 characters apart, or < 70 apart with , ; and / or between them
    assert extract_answer("\\boxed{3} was only a guess. Checking it again gives \\boxed{5}").answer == "5"
    assert extract_answer("\\boxed{3} for part a, and then \\boxed{5}").answer == "3, 5"
    assert extract_answer("\\boxed{41}\\boxed{41}") == extract_answer("\\boxed{41}")
    assert extract_answer("\\boxed{2}, \\boxed{2}, \\boxed{3}").answer == "2, 3"
    eight = ", ".join(f"\\boxed{{{i}}}" for i in range(8))
    assert extract_answer(eight).answer == ", ".join(str(i) for i in range(8))


def test_boxes_combined_as_math_verify_combines_them() -> None:
    from math_verify import parse

    for response in (
        "\\boxed{1} \\boxed{2}",
        "We have \\boxed{1}. Also x. Finally \\boxed{2}, \\boxed{3}",
        "\\boxed{3} for part a, and then \\boxed{5}",
        "\\boxed{3} was only a guess. Checking it again gives \\boxed{5}",
    ):
        found = extract_answer(response)
        mv = parse(response, parsing_timeout=None)[1]  # math-verify's extracted string, boxes joined by ","
        assert found.answer.replace(" ", "") == mv.replace(" ", "")


def test_oversized_box_is_too_complex() -> None:
    with pytest.raises(AnswerTooComplex):
        extract_answer("\\boxed{" + "1" * 5000 + "}")
    with pytest.raises(AnswerTooComplex):  # many boxes of one answer are too long together
        extract_answer(", ".join(f"\\boxed{{{i}}}" for i in range(1000, 1400)))


# Cases of math-verify's published tests (huggingface/Math-Verify tests/test_all.py, test_numina_cases.py,
# test_open_thoughts.py) that or1 used to miss, as (gold, response, expected verdict).
MATH_VERIFY_CASES = [
    ("$34$", "Final Answer: The largest $n$ is 34.", True),  # a prose statement, read whole
    ("\\boxed{x = -5,\\ p = \\frac{14}{3}} ", "$\\boxed{-5, \\frac{14}{3}}$", True),  # labelled set vs values
    ("1,22", "1.22", True),  # a decimal comma in the gold
    ("0,111", "0.111", True),
    (" So the answer is: \\[ \\boxed{32349} \\]", "is $\\boxed{32,\\! 349}$", True),  # a worked gold: its box
    (
        " So the answer is: \\[ \\boxed{32349} \\]",
        "is $\\boxed{32, 349}$",
        False,
    ),  # ", " separates two numbers
    ("$1 - \\frac{1}{\\mathrm{e}}$", "$1 - \\frac{1}{\\mathrm{e}}$", True),  # a lone formula, judged whole
    (
        "$10455$",
        "so $\\boxed{255}$ is the interest. Final Answer: The final answer is $10,455$. I hope it is correct.",
        True,  # Minerva's final-answer sentence after the last box: math-verify's first choice
    ),
    (
        "$x_{1}=\\frac{1}{2}+\\frac{31\\sqrt{5}}{216},\\quadx_{2}=\\frac{1}{2}-\\frac{31\\sqrt{5}}{216}$",
        "$\\boxed{\\dfrac{108 + 31\\sqrt{5}}{216}} \\quad \\text{and} \\quad \\boxed{\\dfrac{108 - 31\\sqrt{5}}{216}}$",
        True,
    ),
]


@pytest.mark.parametrize(("gold", "response", "expected"), MATH_VERIFY_CASES)
def test_math_verify_published_cases(gold: str, response: str, expected: bool) -> None:
    assert verify_math(response, json.dumps([gold])).correct == expected


def test_decimal_comma_is_a_second_reading_of_the_gold_only() -> None:
    assert verify_math("\\boxed{1, 22}", '["1,22"]').correct  # the pair reading still counts
    assert not verify_math("\\boxed{1.2}", '["1, 2"]').correct  # "1, 2" is a list, never 1.2
    assert not verify_math("\\boxed{0.111}", '["111"]').correct


def test_an_intermediate_box_in_an_earlier_math_span_is_not_part_of_the_answer() -> None:
    """Real responses box a value on the way and the final answer later; math-verify (span by span) takes the last."""
    response = "So $x = \\boxed{3}$, hence the area is $\\boxed{5}$."
    assert extract_answer(response).answer == "5"
    assert verify_math(response, '["5"]').correct
    assert extract_answer("$\\boxed{3}$ for part a, and then $\\boxed{5}$").answer == "5"
    assert extract_answer("$\\boxed{1}$ $\\boxed{2}$").answer == "2"
    assert (
        extract_answer("$\\boxed{1}$ and $\\boxed{2}$").answer == "1, 2"
    )  # joined spans are still one answer
    assert extract_answer("\\(\\boxed{1}\\), \\(\\boxed{2}\\)").answer == "1, 2"


@pytest.mark.parametrize("gold", ["(C)", "\\text{(C)}", "C"])
def test_a_lettered_choice_with_its_text_matches_the_letter(gold: str) -> None:
    assert verify_math("The shape is a plane: $\\boxed{\\text{(C) Plane}}$", json.dumps([gold])).correct
    assert not verify_math("$\\boxed{\\text{(D) Sphere}}$", json.dumps([gold])).correct


@pytest.mark.parametrize("pred", ["\\text{(C)}+1", "(C)+1", "\\text{(C) Plane} + 2"])
def test_a_label_inside_a_larger_expression_is_not_the_choice(pred: str) -> None:
    assert not verify_math(f"$\\boxed{{{pred}}}$", json.dumps(["\\text{(C)}"])).correct
