"""What the calling process decides without sympy must be what the pool would decide with it."""

from __future__ import annotations

import json

import pytest

from or1.rewards.math import fast_verdict, math_verify_equal, prejudge, verify_math
from or1.rewards.numeric import values_differ


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


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("2\\sqrt{113}", "2\\sqrt{117}"),
        ("11\\sqrt2", "11\\sqrt8"),
        ("8 \\pi", "9 \\pi"),
        ("\\frac{\\sqrt{3}}{3}", "\\frac{\\sqrt{1}}{3}"),
        ("x^3+3x-6", "x^3+3x-9"),
        ("(a+5)(b+2)", "(a+5)(b+8)"),
        ("(-2,1)", "(-2,2)"),
        ("(5,\\infty)", "(7,\\infty)"),
        ("(3,4]", "(3,6]"),
        ("(1,-16,-4,43)", "(8,-16,-4,43)"),
        ("3, 5, 7", "3, 5, 2"),
        (
            "\\begin{pmatrix} -7 \\\\ 16 \\\\ 5 \\end{pmatrix}",
            "\\begin{pmatrix} -7 \\\\ 16 \\\\ 6 \\end{pmatrix}",
        ),
        ("\\begin{pmatrix} 1/5 \\\\ -18/5 \\end{pmatrix}", "\\begin{pmatrix} 1/5 \\\\ -18/8 \\end{pmatrix}"),
        ("[ \\frac{\\pi^2}{8}, \\frac{5 \\pi^2}{4} ]", "[ \\frac{\\pi^6}{8}, \\frac{5 \\pi^2}{4} ]"),
        ("1+2i", "5+2i"),  # apart whether i is the imaginary unit or a variable
        ("e^2", "e^3"),
        ("1\\frac{4}{5}", "6\\frac{4}{5}"),  # apart as mixed numbers and as products
        ("3R^2", "3R^3"),
        ("\\frac{\\sqrt{21}}{5}", "\\frac{\\sqrt{21}}{0}"),  # a number against an undefined value
        ("(\\frac{3}{5},\\frac{8}{3}]", "(\\frac{3}{0},\\frac{8}{3}]"),
    ],
)
def test_values_that_differ_are_refuted_as_math_verify_and_the_veto_refute_them(gold: str, pred: str) -> None:
    assert values_differ(gold, pred) is True
    assert not math_verify_equal(gold, pred)


@pytest.mark.parametrize(
    ("gold", "pred"),
    [
        ("2\\sqrt{3}", "\\sqrt{12}"),  # equal values: sympy says so, not the fast path
        ("(1,2)", "(2,1)"),  # the same values in another order: a set would be equal
        ("1, 1, 2", "1, 2, 2"),  # the same set
        ("1\\frac{4}{5}", "\\frac{9}{5}"),  # equal as a mixed number
        ("2\\frac{1}{2}", "1"),  # equal as a product
        ("f(x)", "f(y)"),  # a function
        ("ab", "a"),  # one name or two
        ("x^23", "x^2"),  # x^2 * 3 to LaTeX
        ("1,000", "1000"),  # a thousands separator
        ("i^2", "-1"),  # equal with i the imaginary unit
        ("e", "2.71828"),  # equal with e Euler's number
        ("\\frac{1}{3}", "0.33334"),  # within the rounding a decimal is allowed
        ("\\sqrt{-4}", "2"),  # complex
        ("1 \\pm \\sqrt{2}", "1"),
        ("(0,9) \\cup (9,36)", "(0,9) \\cup (9,34)"),
        ("\\frac{1}{0}", "\\frac{2}{0}"),  # both undefined
        ("\\frac{1}{0}", "\\infty"),
        ("\\frac{0}{0}", "1"),
        ("2/3x", "x"),
    ],
)
def test_answers_the_numeric_reading_cannot_be_sure_of_are_left_to_sympy(gold: str, pred: str) -> None:
    assert values_differ(gold, pred) is None


def test_variables_get_the_same_values_on_both_sides() -> None:
    assert values_differ("x + y", "y + x") is None
    assert values_differ("2k", "k + k") is None
    assert values_differ("x^2", "x") is True
