"""Verifiability rules, reference checks, dedup and decontamination on crafted rows."""

from __future__ import annotations

import pytest

from or1.data.converters import MATH_SUFFIX
from or1.data.rows import make_row
from or1.prepare import verifiable
from or1.prepare.dedup import ContaminationIndex, NearDuplicates, exact_key, ngrams, normalize, words


def math(problem: str, answers: list[str], **extra) -> dict:
    return make_row(
        data_source="train-x",
        prompt=[{"role": "user", "content": f"{problem} {MATH_SUFFIX}"}],
        ability="math",
        ground_truth=answers,
        extra_info={"index": 0, **extra},
    )


def code(truth: dict, **extra) -> dict:
    return make_row(
        data_source="train-x",
        prompt=[{"role": "user", "content": "Print the sum of two integers."}],
        ability="code",
        ground_truth=truth,
        extra_info={"index": 0, **extra},
    )


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (math("Find $x$ if $2x = 10$.", ["5"]), None),
        (math("Find the area.", []), verifiable.NO_ANSWER),
        (math("Find the area.", ["notfound"]), verifiable.NO_ANSWER),
        (math("Prove that there are infinitely many primes.", ["2"]), verifiable.PROOF),
        (math("Let n > 1. Show that n^2 > n.", ["1"]), verifiable.PROOF),
        (math("Find n.", ["3"], question_type="proof"), verifiable.PROOF),
        (math("Which is largest? (A) 1 (B) 2 (C) 3", ["C"]), verifiable.MULTIPLE_CHOICE),
        (math("Which is largest?\nA. 1\nB. 2", ["2"]), verifiable.MULTIPLE_CHOICE),
        (math("Which value works?", ["(B)"]), verifiable.MULTIPLE_CHOICE),
        (math("Find m.", ["4"], question_type="MCQ"), verifiable.MULTIPLE_CHOICE),
        (math("(a) Find x. (b) Find y.", ["1"]), verifiable.MULTI_PART),
        (math("Compute:\n1. the sum\n2. the product", ["3"]), verifiable.MULTI_PART),
        (math("Find x and y.", ["x=1; y=2"]), verifiable.MULTI_PART),
        (
            math("Let $f_n = n^2$.\n(1) Find the minimum of $f_3$.\n(2) Find $f_4$.", ["9"]),
            verifiable.MULTI_PART,
        ),
        # what real competition text says without being multiple choice, multi-part or a proof
        (math("[asy]\ndot(A); dot(B); draw(A--B);\n[/asy]\nFind $AB$.", ["6"]), verifiable.URL_OR_FIGURE),
        (math("Let $f(A)\\neq\\emptyset$ for every $A$ and $f(B) = B$. Find the minimum $k$.", ["69"]), None),
        (math("How many $a$ satisfy:\n(1) $a \\le 50$;\n(2) $x^2 + a = 0$ has integer roots?", ["6"]), None),
        (
            math(
                "Find $n$ such that (i) $n^2$ is a difference of cubes; (ii) $2n + 79$ is a square.", ["181"]
            ),
            None,
        ),
        (math("Find the number of $n$ with (a) $5 \\mid n$, (b) $7 \\mid n$, (c) $n < 1000$.", ["28"]), None),
        (math("Find the largest $|f(a) - f(b)|$ over integers $a \\ne b$.", ["1"]), None),
        (math("Find, with proof, the least positive integer $d_n$ not of this form.", ["2"]), None),
        (math("See https://example.com/p.png and find x.", ["1"]), verifiable.URL_OR_FIGURE),
        (math("In the figure shown below, find the angle.", ["30"]), verifiable.URL_OR_FIGURE),
        (code({"inputs": ["1 2\n"], "outputs": ["3\n"]}), None),
        (code({"inputs": [], "outputs": []}), verifiable.NO_TESTS),
        (
            code(
                {
                    "import_prefix": "",
                    "test_code": "def check(c):\n    assert c(1) == 1\n",
                    "entry_point": "f",
                }
            ),
            None,
        ),
        (code({"inputs": ["1\n"], "outputs": ["1\n"]}, has_figure=True), verifiable.URL_OR_FIGURE),
    ],
)
def test_verifiability_rules(row: dict, reason: str | None):
    assert verifiable.unverifiable_reason(row) == reason


def test_math_answer_consistency_uses_the_math_reward():
    rows = [
        math("Find 2+3.", ["5"], solution="2+3 = 5, so the answer is $\\boxed{5}$."),
        math("Find 2+4.", ["7"], solution="2+4 = 6, so the answer is $\\boxed{6}$."),
        math("Find 2+5.", ["7"]),  # no reference solution: nothing to check
    ]
    checked = verifiable.check_math_answers(rows)
    assert [c and c[0] for c in checked] == [None, verifiable.ANSWER_MISMATCH, None]
    assert (
        "'6'" in checked[1][1] and "['7']" in checked[1][1]
    )  # dropped.jsonl says what the reference answered


def test_code_reference_solutions_run_in_the_sandbox():
    from or1.sandbox.pool import unavailable

    reason = unavailable("local")
    if reason:
        pytest.skip(reason)
    truth = {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    rows = [
        code(truth, reference_solution="a, b = map(int, input().split())\nprint(a + b)\n"),
        code(truth, reference_solution="a, b = map(int, input().split())\nprint(a * b)\n"),
        code(truth),
    ]
    checked = verifiable.check_code_solutions(rows)
    assert [c and c[0] for c in checked] == [None, verifiable.SOLUTION_FAILS, None]
    assert "test 0" in checked[1][1]  # dropped.jsonl names the failing test and what it did


def test_normalisation_folds_latex_case_and_spacing():
    assert exact_key("Find $x$ if $2x=4$.") == exact_key("find  x if 2x=4.")
    assert exact_key("joined by ','") != exact_key("joined by '-'")  # punctuation can be the problem
    assert normalize(f"Find x.  {MATH_SUFFIX}") == "find x"  # appended instructions are not the problem
    assert ngrams(["a", "b"], 3) == {("a", "b")} and len(ngrams(list("abcde"), 3)) == 3


def test_near_duplicates_by_minhash():
    base = (
        "A bag contains 5 red marbles and 7 blue marbles. Two marbles are drawn without replacement. "
        "What is the probability that both marbles are red? Express your answer as a common fraction."
    )
    reworded = base.replace("A bag contains", "A jar holds").replace("common fraction", "fraction")
    different = (
        "Let f(x) = x^3 - 6x^2 + 11x - 6. Find the sum of the squares of the roots of f, and give the "
        "largest root as your final answer."
    )
    shingles = [ngrams(words(t), 3) for t in (base, reworded, different)]
    jaccard = len(shingles[0] & shingles[1]) / len(shingles[0] | shingles[1])
    assert jaccard == 25 / 34 and not shingles[0] & shingles[2]
    index = NearDuplicates(threshold=0.6)
    assert index.add("a", base) is None
    assert index.add("b", reworded) == "a"
    assert index.add("c", different) is None


def test_contamination_by_ngram_overlap_ignores_shared_phrasing():
    aime = (
        "Every morning Aya goes for a 9-kilometer-long walk and stops at a coffee shop afterwards. When she walks at "
        "a constant speed of s kilometers per hour, the walk takes her 4 hours, including t minutes spent in the shop."
    )
    boiler = "Put the whole answer in one box at the end after you reason carefully step by step please."
    index = ContaminationIndex(
        [
            ("aime24:0", aime),
            ("x:1", f"Find x. {boiler}"),
            ("x:2", f"Find y. {boiler}"),
            ("x:3", f"Find z. {boiler}"),
        ],
        n=8,
    )
    assert index.match(aime) == "aime24:0"
    snippet = "Aya goes for a 9-kilometer-long walk and stops at a coffee shop afterwards; find s."
    assert index.match(f"Here is a rewritten problem. {snippet}") == "aime24:0"
    assert index.match(f"Compute 2+2. {boiler}") is None  # an n-gram shared by 3 evaluation problems
    assert index.match("Aya walks 9 kilometers every morning.") is None
    assert len(words("Find $x$, please!")) == 3
