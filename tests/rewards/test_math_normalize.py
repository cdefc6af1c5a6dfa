"""Every normalisation the AIME/MATH graders apply, each with a right and a wrong answer (in-process)."""

from __future__ import annotations

import json

import pytest

from or1.rewards.math import verify_math
from or1.rewards.normalize import BadGroundTruth, normalize_answer, parse_ground_truth


def judged(answer: str, gold: str) -> bool:
    return verify_math(f"Work.\n\\boxed{{{answer}}}", json.dumps([gold])).correct


CASES = [
    # (gold, right answer, wrong answer)
    ("025", "25", "250"),  # integers compare as integers: AIME golds are zero-padded
    ("25", "025", "52"),
    ("336^\\circ", "336", "335"),  # an AIME 2025 gold carries a degree sign
    ("90", "90^{\\circ}", "80^{\\circ}"),
    ("90", "90°", "45°"),
    ("15", "15\\text{ cm}^2", "16\\text{ cm}^2"),  # \text{} units
    ("15", "15\\mbox{ meters}", "5\\mbox{ meters}"),
    ("18.90", "\\$18.90", "\\$18.09"),  # currency
    ("1000", "1000 \\text{ dollars}", "100 \\text{ dollars}"),
    ("7425000", "7,425,000", "7,425,001"),  # thousands separators
    ("14916", "14{,}916", "14{,}961"),
    ("1000", "1\\,000", "1\\,001"),
    (
        "(3, \\frac{\\pi}{2})",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
        "\\left( 3, \\frac{\\pi}{3} \\right)",
    ),  # \left/\right
    ("\\frac{14}{3}", "\\dfrac{14}{3}", "\\dfrac{13}{3}"),  # \dfrac and \tfrac
    ("\\frac{1}{3}", "\\tfrac13", "\\tfrac14"),
    ("5", "x = 5", "x = 6"),  # an equation with a variable on the left
    ("x=5", "5", "-5"),
    ("k = \\frac{1}{3}", "\\frac{1}{3}", "\\frac{1}{4}"),
    (
        "2x+4y-3=0",
        "y = -\\frac{1}{2}x + \\frac{3}{4}",
        "y = -\\frac{1}{2}x + \\frac{5}{4}",
    ),  # but a whole equation stays whole
    ("[-2, 7]", "[-2,7]", "(-2,7]"),  # intervals: endpoints and their openness
    ("(-\\infty, 3)", "(-\\infty,3)", "(-\\infty,3]"),
    ("\\{1, 2, 3\\}", "\\{3, 1, 2\\}", "\\{1, 2\\}"),  # sets ignore order, not elements
    ("(1, 2)", "(1,2)", "(2, 1)"),  # tuples: order matters
    (
        "\\begin{pmatrix} 1 \\\\ -2 \\end{pmatrix}",
        "\\begin{pmatrix}1\\\\-2\\end{pmatrix}",
        "\\begin{pmatrix}1\\\\2\\end{pmatrix}",
    ),
    (
        "\\begin{pmatrix} 0 & 3 \\\\ 0 & -1 \\end{pmatrix}",
        "\\begin{bmatrix} 0 & 3 \\\\ 0 & -1 \\end{bmatrix}",
        "\\begin{pmatrix} 0 & 3 \\\\ 0 & 1 \\end{pmatrix}",
    ),
    ("\\frac{1}{3}", "0.333333", "0.3334"),  # numeric tolerance: a rounded decimal of the exact value
    ("\\sqrt{2}", "1.414214", "1.4142"),
    ("0.5", "\\frac{1}{2}", "\\frac{1}{3}"),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", "\\frac{\\sqrt2}{2}"),
    ("2\\sqrt{2}", "\\sqrt{8}", "\\sqrt{6}"),
    ("28\\%", "28", "29"),  # percentages as math-verify reads them
    ("\\text{Evelyn}", "\\text{Evelyn}", "\\text{Briana}"),
    ("1-\\frac{1}{\\mathrm{e}}", "1-\\frac{1}{e}", "1+\\frac{1}{e}"),
    ("x^2+2x+1", "(x+1)^2", "(x-1)^2"),
]


@pytest.mark.parametrize("gold,right,wrong", CASES)
def test_right_answer_is_correct_and_wrong_answer_is_not(gold: str, right: str, wrong: str) -> None:
    assert judged(right, gold), f"{right!r} should equal {gold!r}"
    assert not judged(wrong, gold), f"{wrong!r} should not equal {gold!r}"


def test_normalised_spellings() -> None:
    assert normalize_answer("025") == "25"
    assert normalize_answer("336^\\circ") == "336"
    assert normalize_answer("\\$1,000.50") == "1000.50"
    assert normalize_answer("$x = \\dfrac{1}{2}$.") == "\\frac{1}{2}"


def test_any_of_several_golds() -> None:
    assert verify_math("\\boxed{7}", '["6", "7"]').correct
    assert not verify_math("\\boxed{8}", '["6", "7"]').correct


@pytest.mark.parametrize("ground_truth", ["[]", '[""]', "null", '[{"a": 1}]', 5.5j if False else None])
def test_unusable_ground_truth_is_bad_input(ground_truth: object) -> None:
    result = verify_math("\\boxed{1}", ground_truth)  # type: ignore[arg-type]
    assert (result.score, result.reason) == (0.0, "bad_input")


def test_plain_string_ground_truth_is_one_answer() -> None:
    assert parse_ground_truth("[0,1)") == ["[0,1)"]
    assert parse_ground_truth('["15625"]') == ["15625"]
    with pytest.raises(BadGroundTruth):
        parse_ground_truth("   ")
    assert verify_math("\\boxed{[0, 1)}", "[0,1)").correct


@pytest.mark.parametrize(
    "pred,expected", [("52_8", True), ("101010_2", True), ("52_3", False), ("53_8", False)]
)
def test_numerals_with_a_base_compare_by_value(pred: str, expected: bool) -> None:
    assert judged(pred, "52_8") == expected
