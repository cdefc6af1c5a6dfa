"""Verifiability filters and reference checks: which rows a rule-based reward can judge fairly.

`unverifiable_reason(row)` applies the cheap text rules (proofs, multiple choice, multi-part questions, URLs or
figures, missing answers, code without tests) and names the first that fires. `check_math_answers` and
`check_code_solutions` are the expensive checks, run through or1's own rewards: the answer re-extracted from a
math row's reference solution must verify against its given answer, and a code row's reference solution must pass
its tests in the sandbox. Rows without a reference pass both checks untouched.
"""

from __future__ import annotations

import json
import re
from typing import Any

from or1.rewards.result import CORRECT

PROOF = "proof"
MULTIPLE_CHOICE = "multiple_choice"
MULTI_PART = "multi_part"
URL_OR_FIGURE = "url_or_figure"
NO_ANSWER = "no_answer"
NO_TESTS = "no_tests"
ANSWER_MISMATCH = "answer_mismatch"
SOLUTION_FAILS = "solution_fails_tests"
RULES = (NO_ANSWER, NO_TESTS, PROOF, MULTIPLE_CHOICE, MULTI_PART, URL_OR_FIGURE)

_PROOF = re.compile(
    r"\b(prove|show|demonstrate|verify|justify)\b[^.?!]{0,40}\bthat\b|(?<!with )\bproof\b", re.IGNORECASE
)
# a choice label stands alone: "(A)" in `dot(A)` or `f(A)` is an argument, not a choice
_CHOICES = re.compile(
    r"(?<![\w\\])\(A\)(?!\s*[=\\<>,;)])[\s\S]*(?<![\w\\])\(B\)|(^|\n)\s*A[.:)]\s[\s\S]*\n\s*B[.:)]\s"
    r"|\\textbf\{\(A\)",
    re.MULTILINE,
)
_LETTER = re.compile(r"^\s*\(?\\?(text|textbf|mathrm)?\{?\(?[A-E]\)?\}?\s*$")
# a part label: "(a)", "(ii)", "(2)" not after a name (`f(a)`), or "1." / "2)" at a line start
_PART_LABEL = re.compile(r"(?<![\w\\])\((?:[a-e]|i{1,3}|iv|I{1,3}|IV|[1-5])\)|(?:^|\n)\s*[1-5][.)]\s")
# a part asks something; numbered conditions ("(1) f(1) = 1; (2) ...") only state facts
_ASKS = re.compile(
    r"\b(find|determine|compute|calculate|evaluate|prove|show|what|how many|how much|express)\b|\?",
    re.IGNORECASE,
)
# "Compute:" / "Find the following:" before a list asks each item; "Find n satisfying these conditions:" does not
_ASKS_EACH = re.compile(
    r"\b(find|determine|compute|calculate|evaluate)(\s+the\s+following)?\s*:\s*$", re.IGNORECASE
)
_ASY = re.compile(r"\[asy\][\s\S]*?(\[/asy\]|$)", re.IGNORECASE)
_URL_FIGURE = re.compile(
    r"https?://|www\.|!\[|<img|\[asy\]|\b(figure|diagram|picture|image)\b[^.]{0,30}\b(below|above|shown)\b"
    r"|\bshown in the (figure|diagram|picture)\b|\bsee (the )?(figure|diagram|picture)\b",
    re.IGNORECASE,
)
_NO_ANSWERS = {"", "proof", "notfound", "none", "null", "n/a", "see solution"}


def problem_text(row: dict[str, Any]) -> str:
    """The text of a row's user messages (what the problem says)."""
    return "\n".join(m["content"] for m in row["prompt"] if m.get("role") == "user")


def math_answers(row: dict[str, Any]) -> list[str]:
    """The acceptable answers of a math row as text (a plain non-JSON ground truth is one answer)."""
    truth = row["reward_model"]["ground_truth"]
    try:
        decoded = json.loads(truth)
    except ValueError:
        decoded = truth
    answers = decoded if isinstance(decoded, list) else [decoded]
    return [str(a).strip() for a in answers if a is not None and str(a).strip()]


def code_tests(row: dict[str, Any]) -> dict[str, Any]:
    truth = json.loads(row["reward_model"]["ground_truth"])
    return {k: v for k, v in truth.items() if v is not None}


def unverifiable_reason(row: dict[str, Any]) -> str | None:
    """The first verifiability rule (RULES order) that `row` breaks, or None when a rule-based reward can judge it."""
    found = unverifiable(row)
    return found[0] if found else None


def unverifiable(row: dict[str, Any]) -> tuple[str, str] | None:
    """(rule, the text that fired it) for the first rule `row` breaks, or None; the text goes to dropped.jsonl."""
    text, extra = problem_text(row), row.get("extra_info") or {}
    if row["ability"] == "math":
        answers = math_answers(row)
        if not answers or all(a.lower() in _NO_ANSWERS for a in answers):
            return NO_ANSWER, f"answers {answers}"
        kind = str(extra.get("question_type") or "").lower()
        if kind == "proof":
            return PROOF, "question_type proof"
        if match := _PROOF.search(text):
            return PROOF, _quote(text, match)
        words = _ASY.sub(" ", text)  # Asymptote code (`dot(A); dot(B)`) is a figure, not choices or parts
        if kind in ("mcq", "multiple-choice"):
            return MULTIPLE_CHOICE, f"question_type {kind}"
        if match := _CHOICES.search(words):
            return MULTIPLE_CHOICE, _quote(words, match)
        if letters := [a for a in answers if _LETTER.match(a)]:
            return MULTIPLE_CHOICE, f"answer {letters[0]}"
        if parts := _multi_part(words):
            return MULTI_PART, parts
        if several := [a for a in answers if ";" in a]:
            return MULTI_PART, f"answer {several[0]}"
    else:
        tests = code_tests(row)
        if not tests.get("test_code") and not tests.get("inputs"):
            return NO_TESTS, "no test_code and no inputs"
    if extra.get("has_figure"):
        return URL_OR_FIGURE, "extra_info.has_figure (the source counts a figure)"
    if match := _URL_FIGURE.search(text):
        return URL_OR_FIGURE, _quote(text, match)
    return None


def _quote(text: str, match: re.Match[str], width: int = 120) -> str:
    """The matched text (cut to `width`) with a little context, on one line."""
    start = max(0, match.start() - 30)
    piece = text[start : min(match.end(), match.start() + width) + 30]
    return " ".join(piece.split())


def _multi_part(text: str) -> str | None:
    """Two or more labelled parts that each ask something, or a list of them after "Compute:" (several answers):
    the text of the first two parts, else None."""
    labels = list(_PART_LABEL.finditer(text))
    if len(labels) < 2:
        return None
    ends = [m.start() for m in labels[1:]] + [len(text)]
    if _ASKS_EACH.search(text[: labels[0].start()]):
        asking = labels
    else:
        asking = [m for m, end in zip(labels, ends, strict=True) if _ASKS.search(text[m.end() : end])]
    if len(asking) < 2:
        return None
    return " ".join(text[asking[0].start() : ends[labels.index(asking[1])]][:200].split())


def math_reference(row: dict[str, Any]) -> str | None:
    solution = (row.get("extra_info") or {}).get("solution")
    return solution if isinstance(solution, str) and solution.strip() else None


def code_reference(row: dict[str, Any]) -> str | None:
    solution = (row.get("extra_info") or {}).get("reference_solution")
    return solution if isinstance(solution, str) and solution.strip() else None


Check = tuple[str, str] | None  # (drop reason, what failed) or None when the reference passes


def check_math_answers(rows: list[dict[str, Any]], workers: int = 1) -> list[Check]:
    """(ANSWER_MISMATCH, what the reference solution's answer was) for each math row whose reference solution's
    final answer does not verify, else None."""
    from or1.rewards.score import score_batch

    todo = [i for i, row in enumerate(rows) if row["ability"] == "math" and math_reference(row)]
    verdicts: list[Check] = [None] * len(rows)
    if not todo:
        return verdicts
    scored = score_batch([{**rows[i], "response": math_reference(rows[i])} for i in todo], workers=workers)
    for i, result in zip(todo, scored, strict=True):
        if result.reason != CORRECT:
            found = "no final answer" if result.extracted is None else f"answer {result.extracted!r}"
            verdicts[i] = (
                ANSWER_MISMATCH,
                f"reference solution: {found} ({result.reason}); gold {math_answers(rows[i])}",
            )
    return verdicts


def check_code_solutions(rows: list[dict[str, Any]], workers: int = 1, backend: str = "local") -> list[Check]:
    """(SOLUTION_FAILS, the failing test and what it did) for each code row whose reference solution fails its own
    tests in the sandbox, else None."""
    from or1.rewards.code import score_code_batch

    todo = [i for i, row in enumerate(rows) if row["ability"] == "code" and code_reference(row)]
    verdicts: list[Check] = [None] * len(rows)
    if not todo:
        return verdicts
    responses = [f"```python\n{code_reference(rows[i])}\n```" for i in todo]
    truths = [rows[i]["reward_model"]["ground_truth"] for i in todo]
    for i, result in zip(
        todo, score_code_batch(responses, truths, slots=workers, backend=backend), strict=True
    ):
        if result.reason != CORRECT:
            verdicts[i] = (SOLUTION_FAILS, f"{result.reason}: {result.detail or 'no detail'}")
    return verdicts
