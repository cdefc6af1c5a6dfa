"""What the calling process decides without sympy must be what the pool would decide with it."""

from __future__ import annotations

import json

import pytest

from or1.rewards.math import fast_verdict, math_verify_equal, prejudge, verify_math


@pytest.mark.parametrize(
    "text",
    [
        "I could not finish the computation.",
        "We tried x plus y (see above).",
        "  \n",
        "Done: ok; (a, b) or c!",
    ],
)
def test_text_math_verify_cannot_extract_from_is_no_answer_in_process(text: str) -> None:
    from math_verify import parse

    assert parse(text, parsing_timeout=None) == []  # guards the rule if math-verify's extraction changes
    decided = prejudge("<think>x</think>" + text, '["7"]')
    assert decided is not None and decided.reason == "no_answer"


@pytest.mark.parametrize(
    "text", ["We got 7 apples.", "It is [seven] here", "so $x$ then", "\\frac{1}{2} it is"]
)
def test_text_that_may_hold_math_still_goes_to_math_verify(text: str) -> None:
    assert prejudge("<think>x</think>" + text, '["7"]') is None


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("\\frac{1}{2}", "\\frac{2}{4}"),
        ("\\frac14", "\\dfrac14"),
        ("\\frac9{19}", "\\frac1{19}"),
        ("-\\frac{24}{25}", "-\\frac{22}{25}"),
        ("\\frac{270}7", "\\frac{276}{7}"),
        ("2", "\\frac{4}{2}"),
        ("2", "\\frac{5}{2}"),
        ("3/4", "\\frac{3}{4}"),
        ("\\frac{1}{3}", "-\\frac{1}{3}"),
    ],
)
def test_fractions_are_decided_in_process_as_math_verify_decides_them(gold: str, pred: str) -> None:
    verdict = fast_verdict(gold, pred)
    assert verdict is not None
    assert verdict == math_verify_equal(gold, pred)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [("\\frac{1}{3}", "0.333333"), ("\\frac{3}{0}", "\\frac{3}{5}"), ("1\\frac{4}{5}", "\\frac{9}{5}")],
)
def test_decimals_zero_denominators_and_mixed_numbers_are_left_to_sympy(gold: str, pred: str) -> None:
    assert fast_verdict(gold, pred) is None


def test_a_difference_inside_the_veto_tolerance_is_left_to_sympy() -> None:
    big = 10**20
    assert fast_verdict(f"\\frac{{1}}{{{big}}}", f"\\frac{{1}}{{{big + 1}}}") is None
    assert not verify_math("\\boxed{\\frac{1}{3}}", json.dumps(["\\frac{1}{7}"])).correct
