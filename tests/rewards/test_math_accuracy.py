"""Accuracy on a sample written after math-verify's own test suite (its categories, our cases): or1's math reward
must be right on every case, and never right on fewer cases than math-verify used plainly (gold wrapped as
\\boxed{gt}, the response parsed whole, as Skywork-OR1 calls it)."""

from __future__ import annotations

import json

import pytest

from or1.rewards.math import verify_math

# (gold, response, expected correct)
TABLE = [
    # numbers: signs, separators, decimals, units
    ("-7", "So $\\boxed{-7}$.", True),
    ("3215000", "The total is \\boxed{3,215,000}.", True),
    ("2000", "\\boxed{2000.0}", True),
    ("0.25", "\\boxed{.25}", True),
    ("1300.5", "\\boxed{\\$1,300.50}", True),
    ("3", "\\boxed{ZZ3Q}", False),
    ("12", "\\boxed{12\\text{ inches}}", True),
    # fractions
    ("8/7", "\\boxed{\\frac{8}{7}}", True),
    ("-8/7", "\\boxed{-\\dfrac{8}{7}}", True),
    ("\\frac{2}{5}", "\\boxed{\\frac25}", True),
    ("1", "\\boxed{\\frac5{5}}", True),
    ("\\frac{2}{5}", "\\boxed{\\frac{5}{2}}", False),
    # intervals and sets
    ("[0,2)", "\\boxed{[0,2)}", True),
    ("[0,5)", "\\boxed{[0,2)}", False),
    ("(0,5)", "\\boxed{[0,5)}", False),
    ("(4,1)", "\\boxed{\\{1,4\\}}", False),
    ("\\{1, 4\\}", "\\boxed{\\{4,1\\}}", True),
    ("[-3, 8]", "The solution set is \\boxed{x \\in [-3,8]}", True),
    # notation
    ("\\sqrt{5}", "\\boxed{\\sqrt5}", True),
    ("\\frac{1}{4}", "\\boxed{\\left( \\frac{1}{4} \\right)}", True),
    ("\\frac{1}{4}", "\\boxed{\\frac{1}{4}\\text{ meters}}", True),
    ("\\frac{1}{4}", "\\boxed{r = \\frac{1}{4}}", True),
    ("\\frac{1}{4}", "\\boxed{\\cfrac{1}{4}}", True),
    ("9", "Answer: $9$", True),
    ("9", "Final answer: \\( 4+5 \\)", True),
    # percent
    ("35\\%", "\\boxed{35\\%}", True),
    ("35\\%", "\\boxed{35}", True),
    ("35\\%", "\\boxed{36\\%}", False),
    # solutions with a final box
    ("3\\sqrt{10}", "We get $\\sqrt{90} = \\boxed{3\\sqrt{10}}$.", True),
    ("\\frac{5}{56}", "Hence \\[p(9) = \\boxed{\\frac{5}{56}}.\\]", True),
    ("90^\\circ", "the angle is $\\boxed{90^\\circ}$.", True),
    ("12\\mbox{ cm}^2", "area $= \\boxed{12\\mbox{ cm}^2}$", True),
    ("\\text{Carla}", "Therefore $\\boxed{\\text{Carla}}$ is fastest.", True),
    ("(2, \\frac{\\pi}{3})", "polar: $\\boxed{\\left( 2, \\frac{\\pi}{3} \\right)}$", True),
    (
        "\\begin{pmatrix} 2 & 1 \\\\ 0 & -3 \\end{pmatrix}",
        "\\boxed{\\begin{pmatrix} 2 & 1 \\\\ 0 & -3 \\end{pmatrix}}",
        True,
    ),
    (
        "\\begin{pmatrix} 2 & 1 \\\\ 0 & -3 \\end{pmatrix}",
        "\\boxed{\\begin{pmatrix} 2 & 1 \\\\ 0 & 3 \\end{pmatrix}}",
        False,
    ),
    # answers with several parts (numina-style)
    ("(5,2),(7,2)", "\\boxed{(7,2),(5,2)}", True),
    ("(p,q)=(5,3)", "\\boxed{(5,3)}", True),
    ("-3, 2", "\\boxed{2, -3}", True),
    ("x=-4, y=\\frac{7}{3}", "\\boxed{x = -4, y = \\frac{7}{3}}", True),
    ("\\text{even}", "\\boxed{\\text{even}}", True),
    ("11:20", "\\boxed{11:20}", True),
    # zero-padded integers and degree golds (AIME)
    ("025", "\\boxed{25}", True),
    ("336^\\circ", "\\boxed{336}", True),
    ("070", "\\boxed{7}", False),
    # false positives of math-verify
    ("\\frac{1}{2^{99}}", "\\boxed{\\frac{1}{2^{98}}}", False),
    ("\\frac{1}{2004!}", "\\boxed{\\frac{1}{2006!}}", False),
    ("0.0000012", "\\boxed{0.0000014}", False),
]


def _plain_math_verify(gold: str, response: str) -> bool:
    from math_verify import parse, verify

    return verify(
        parse("\\boxed{" + gold + "}", parsing_timeout=None),
        parse(response, parsing_timeout=None),
        timeout_seconds=None,
    )


@pytest.mark.parametrize("gold,response,expected", TABLE)
def test_or1_is_right_on_each_case(gold: str, response: str, expected: bool) -> None:
    assert verify_math(response, json.dumps([gold])).correct == expected


def test_or1_is_no_less_accurate_than_plain_math_verify() -> None:
    ours = sum(verify_math(r, json.dumps([g])).correct == e for g, r, e in TABLE)
    plain = sum(_plain_math_verify(g, r) == e for g, r, e in TABLE)
    assert ours >= plain, f"or1 {ours}/{len(TABLE)} vs plain math-verify {plain}/{len(TABLE)}"
    assert ours == len(TABLE)
