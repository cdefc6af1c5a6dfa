"""Pairs math-verify has called equal (its issue tracker, #14, #41, #60) that the math reward must call wrong."""

from __future__ import annotations

import json

import pytest

from or1.rewards.math import verify_math

FALSE_POSITIVES = [
    ("1-\\frac{1}{e}", "1+\\frac{1}{e}"),
    ("\\frac{1}{2^{99}}", "\\frac{1}{2^{98}}"),  # evalf(chop=True) rounds both tiny values to zero
    ("\\frac{1}{2004!}", "\\frac{1}{2006!}"),
    ("\\frac{2^{2005}+1}{3 \\cdot 2^{2006}}", "\\frac{1}{3 \\cdot 2^{2006}}"),
    ("4", "4\\sqrt{2}"),
    ("4", "4\\sqrt(2)"),
    ("\\pm 2021", "2021"),
    ("n=2, 3, 4", "n=1, 2, 3"),
    ("D = (0, 1)", "D = (0, 1.5)"),
    ("3x-y+13=0", "3x+4y+14=0"),
    ("12:00", "1:00"),
    ("0.0000012", "0.0000014"),  # six-decimal rounding makes different small decimals equal
    ("(\\frac{1}{2^{99}}, 1)", "(\\frac{1}{2^{98}}, 1)"),  # the same inside a tuple
    ("\\{3, \\frac{1}{2^{99}}\\}", "\\{\\frac{1}{2^{98}}, 3\\}"),  # and inside a set
    ("\\frac{x}{2^{60}}", "\\frac{x}{2^{61}}"),  # and with a free variable
    ("1, 2, \\ldots, n", "1, 3, 5, \\ldots, 2n-1"),  # math-verify parses both sequences as the number 2
]


@pytest.mark.parametrize("gold,pred", FALSE_POSITIVES)
def test_known_false_positive_is_wrong(gold: str, pred: str) -> None:
    result = verify_math(f"\\boxed{{{pred}}}", json.dumps([gold]))
    assert (result.score, result.reason) == (0.0, "wrong_answer")


@pytest.mark.parametrize(
    "gold,pred",
    [
        ("\\frac{1}{2^{99}}", "2^{-99}"),
        ("4\\sqrt{2}", "4\\sqrt(2)"),
        ("\\frac{1}{2004!}", "\\frac{1}{2004!}"),
        ("1, 2, \\ldots, n", "1,2,\\ldots,n"),
    ],
)
def test_the_guard_keeps_true_equalities(gold: str, pred: str) -> None:
    assert verify_math(f"\\boxed{{{pred}}}", json.dumps([gold])).correct
