"""The math reward: is the final answer of a response equal to one of the ground truths?

`verify_math` is what a pool worker runs for one response (training, evaluation and data preparation reach it
through `or1.rewards.score.score_batch`, which adds the process pool and the hard timeout). Steps:
1. extract the final answer after the last `</think>` (`or1.rewards.extract`): the last box (a run of connected
   boxes combined), else an answer statement, else (extraction mode math_verify, the default) math-verify's own
   extraction of the text, whose parse is then compared as math-verify compares it and, as a string, the or1 way;
2. reject answers too costly for sympy (power towers, huge integers) as wrong;
3. a fast path decides without sympy: normalised strings equal, both plain numbers (`025` = `25`), numerals with
   a base (`52_8`), sequences with an ellipsis (compared as written: math-verify mis-parses them);
4. otherwise a numeric check (`or1.rewards.equivalence`) vetoes pairs whose values provably differ (math-verify's
   false positives, and most wrong answers, cheaply), and math-verify decides the rest, the gold wrapped as
   `\\boxed{gt}` as Skywork-OR1 does, with its SIGALRM timeouts off (the pool's kill is the limit).
"""

from __future__ import annotations

import functools
import logging
import re
from dataclasses import dataclass
from typing import Any

from or1.rewards.extract import AnswerTooComplex, Extraction, extract_answer, fallback_text, lone_math
from or1.rewards.normalize import (
    EXACT_RTOL,
    BadGroundTruth,
    decimal_comma_reading,
    exact_rational,
    has_percent,
    normalize_answer,
    parse_ground_truth,
    plain_number,
    too_costly,
)
from or1.rewards.numeric import values_differ
from or1.rewards.result import BAD_INPUT, CORRECT, NO_ANSWER, WRONG_ANSWER, Result

_ELLIPSIS = re.compile(r"\\[lc]?dots\b|\.\.\.")
_BASE_NUMERAL = re.compile(r"^([0-9A-Za-z]+)_\{?(\d{1,2})\}?$")
_PROSE_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{4,}")
_CHOICE_GOLD = re.compile(r"^\(?([A-E])\)?$")  # a multiple-choice gold: (C) or C
# an answer that is a label and at most the choice's words: (C) Plane, \text{(C) Plane}; never `\text{(C)}+1`
_CHOICE_WORDS = r"(?:\s+[A-Za-z][A-Za-z .,'-]*)?"
_CHOICE_PRED = re.compile(
    rf"^(?:\\text(?:bf)?\{{\(?([A-E])\){_CHOICE_WORDS}\}}|\(?([A-E])\){_CHOICE_WORDS})$"
)


class _DropTimeoutDisabledWarning(logging.Filter):
    """math-verify warns once per process that its timeouts are off; here that is intended (the pool kills)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in record.getMessage()


for _name in ("math_verify.parser", "math_verify.grader"):
    logging.getLogger(_name).addFilter(_DropTimeoutDisabledWarning())


def _base_numeral(text: str) -> tuple[str, int] | None:
    """`52_8` / `1011_{2}`: a numeral with its base, which math-verify reads as the plain number (base dropped)."""
    match = _BASE_NUMERAL.match(text.replace(" ", ""))
    return (match.group(1).upper(), int(match.group(2))) if match else None


def fast_verdict(gold: str, pred: str) -> bool | None:
    """Decide cheaply on normalised answers: True/False when sure, None when sympy has to look."""
    if gold == pred and gold:
        return True
    choice, label = _CHOICE_GOLD.match(gold), _CHOICE_PRED.match(pred)
    if choice and label:  # `\text{(C) Plane}` against the gold (C): the label is the answer
        return choice.group(1) == (label.group(1) or label.group(2))
    if _ELLIPSIS.search(gold) or _ELLIPSIS.search(pred):
        return gold.replace(" ", "") == pred.replace(" ", "")  # math-verify parses `1, 2, \\ldots, n` as 2
    gold_base, pred_base = _base_numeral(gold), _base_numeral(pred)
    if gold_base and pred_base:
        gold_value, pred_value = _base_value(*gold_base), _base_value(*pred_base)
        return gold_value is not None and gold_value == pred_value
    gold_num, pred_num = plain_number(gold), plain_number(pred)
    if gold_num is None or pred_num is None:
        return _rational_verdict(gold, pred)
    if gold_num == pred_num:
        return True
    return None if has_percent(gold) or has_percent(pred) else False


def _rational_verdict(gold: str, pred: str) -> bool | None:
    """Integers and fractions of integers, compared exactly: math-verify calls equal values equal, and unequal ones
    either different or, when it chops a tiny difference, the numeric veto overrules it beyond `EXACT_RTOL`; so
    the verdict is known without sympy except inside that tolerance."""
    gold_value, pred_value = exact_rational(gold), exact_rational(pred)
    if gold_value is None or pred_value is None:
        return None
    if gold_value == pred_value:
        return True
    return (
        False if abs(gold_value - pred_value) > EXACT_RTOL * max(abs(gold_value), abs(pred_value)) else None
    )


def _base_value(digits: str, base: int) -> int | None:
    """The value of `digits` in `base`, or None when they are not a numeral in that base."""
    try:
        return int(digits, base) if 2 <= base <= 36 else None
    except ValueError:
        return None


def _is_prose(answer: str) -> bool:
    """A stated answer in words ("The largest n is 34") is left to math-verify's own extraction."""
    without_text = re.sub(r"\\(?:text|mbox|mathrm)\s*\{[^{}]*\}", " ", answer)
    return len(_PROSE_WORD.findall(without_text)) >= 2


@functools.lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> tuple[Any, ...]:
    """math-verify's parse of a gold; cached because every rollout of a prompt shares it."""
    from math_verify import parse

    return tuple(parse("\\boxed{" + gold + "}", parsing_timeout=None))


def _sympy_first(parsed: tuple[Any, ...] | list[Any]) -> Any:
    """The sympy object math-verify parsed (its parse lists it before the raw string), or None."""
    from sympy import Basic, MatrixBase

    return next((p for p in parsed if isinstance(p, (Basic, MatrixBase))), None)


def math_verify_equal(gold: str, pred: str, *, boxed: bool = True) -> bool:
    """math-verify's verdict on one gold/prediction pair, overruled when the values provably differ.

    The numeric check runs first: it is the same veto either way, and it spares sympy's `simplify` on the wrong
    answers it already refutes (most wrong answers, and the costly part of a batch).
    """
    from math_verify import parse, verify

    from or1.rewards.equivalence import contradicts

    gold_parsed = _parse_gold(gold)
    pred_parsed = parse("\\boxed{" + pred + "}" if boxed else pred, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    gold_obj, pred_obj = _sympy_first(gold_parsed), _sympy_first(pred_parsed)
    if gold_obj is not None and pred_obj is not None and contradicts(gold_obj, pred_obj):
        return False
    return bool(verify(list(gold_parsed), pred_parsed, timeout_seconds=None))


def gold_answer(gold: str) -> str:
    """The normalised answer of one gold; a gold that is a worked solution with a box is read like a response."""
    if "\\boxed" in gold or "\\fbox" in gold:
        try:
            found = extract_answer(gold, "boxed")
        except AnswerTooComplex:
            found = None
        if found is not None:
            return _normalized(found)
    return normalize_answer(gold)


def _normalized(found: Extraction, *, strip_lhs: bool = True) -> str:
    """The normalised answer; combined boxes are normalised one by one (no thousands separator across them)."""
    if found.parts:
        return ", ".join(normalize_answer(part, strip_lhs=strip_lhs) for part in found.parts)
    return normalize_answer(found.answer, strip_lhs=strip_lhs)


def _pred_for(gold: str, found: Extraction, pred: str, prose: bool) -> str:
    """The spelling of the answer math-verify compares with `gold`."""
    if prose:
        return found.context or found.answer  # math-verify's own extraction finds the math in the statement
    if "=" in gold:
        # a whole-equation gold (2x + 4y = 3) meets the whole answer
        return _normalized(found, strip_lhs=False)
    return pred


Prepared = tuple[str, list[tuple[str, str, bool]]]  # answer, (gold, pred, wrap pred in a box) pairs


@dataclass(frozen=True)
class _Unextracted:
    """No box and no statement: math-verify's own extraction decides, in the pool (it needs sympy)."""

    text: str
    golds: list[str]


def _prepare(response: str, ground_truth: str, extraction: str) -> Result | Prepared | _Unextracted:
    """Everything before sympy: a final Result when decided, else the answer and the (gold, pred) pairs to compare."""
    if not isinstance(response, str):
        return Result(0.0, BAD_INPUT, detail=f"response must be a string, got {type(response).__name__}")
    try:
        golds = parse_ground_truth(ground_truth)
    except BadGroundTruth as err:
        return Result(0.0, BAD_INPUT, detail=str(err))
    golds += [d for d in map(decimal_comma_reading, golds) if d is not None]
    try:
        found = extract_answer(response, extraction)
    except AnswerTooComplex as err:
        return Result(0.0, WRONG_ANSWER, detail=str(err))
    if found is None:
        text = fallback_text(response) if extraction == "math_verify" else None
        return Result(0.0, NO_ANSWER) if text is None else _Unextracted(text, golds)
    return _compare_answer(found, golds)


def _compare_answer(found: Extraction, golds: list[str]) -> Result | Prepared:
    """A final Result when string work decides the answer, else the (gold, pred) pairs sympy must compare."""
    answer = found.answer
    pred = _normalized(found)
    if not pred:
        return Result(0.0, NO_ANSWER, extracted=answer)
    costly = too_costly(pred)
    if costly:
        return Result(0.0, WRONG_ANSWER, extracted=answer, detail=costly)
    prose = found.kind == "statement" and _is_prose(answer)
    undecided = []
    for gold in golds:
        gold_norm = gold_answer(gold)
        verdict = fast_verdict(gold_norm, pred)
        if verdict:
            return Result(1.0, CORRECT, extracted=answer)
        if verdict is None and not prose and not found.context and values_differ(gold_norm, pred):
            continue  # its values differ from the gold's: no reading makes them equal, no sympy needed
        if verdict is None and not too_costly(gold_norm):
            undecided.append((gold_norm, _pred_for(gold_norm, found, pred, prose), not prose))
            if (
                found.context and not prose
            ):  # a statement math-verify may read better whole ("the largest n is 34")
                undecided.append((gold_norm, found.context, False))
    if not undecided:
        return Result(0.0, WRONG_ANSWER, extracted=answer)
    return answer, undecided


def prejudge(response: str, ground_truth: str, extraction: str = "math_verify") -> Result | None:
    """The Result when string work alone decides (no answer, bad input, plain-number or exact match), else None.

    Cheap and bounded (linear scans, capped answer length), so `score_batch` runs it in the calling process and
    sends only the undecided rows to the pool.
    """
    prepared = _prepare(response, ground_truth, extraction)
    return prepared if isinstance(prepared, Result) else None


def verify_math(response: str, ground_truth: str, extraction: str = "math_verify") -> Result:
    """Score one response against a ground truth (JSON list of acceptable answers, or a plain string).

    `extraction` (reward.math_extraction): math_verify (default, as Skywork-OR1), statement or boxed, see
    `or1.rewards.extract`. In-process and without a timeout: call it through `score_batch` (or inside a pool
    worker) for the hard limit.
    """
    prepared = _prepare(response, ground_truth, extraction)
    if isinstance(prepared, Result):
        return prepared
    if isinstance(prepared, _Unextracted):
        return _verify_unextracted(prepared)
    return _verify_pairs(prepared)


def _verify_pairs(prepared: Prepared) -> Result:
    answer, pairs = prepared
    for gold, pred, boxed in pairs:
        if math_verify_equal(gold, pred, boxed=boxed):
            return Result(1.0, CORRECT, extracted=answer)
    return Result(0.0, WRONG_ANSWER, extracted=answer)


def _verify_unextracted(task: _Unextracted) -> Result:
    """math-verify's own extraction of a response without box or statement, compared two ways (either suffices).

    As math-verify compares (its parse of the text against the boxed gold, under or1's numeric veto), and as or1
    compares the answer string math-verify extracted (the normalisations of `_compare_answer`).
    """
    from math_verify import parse, verify

    from or1.rewards.equivalence import contradicts

    lone = lone_math(task.text)
    if lone is not None:  # the whole text is one formula: judged as if boxed (math-verify may cut it short)
        whole = _compare_answer(Extraction(lone, "math_verify"), task.golds)
        whole = whole if isinstance(whole, Result) else _verify_pairs(whole)
        if whole.correct:
            return whole
    parsed = parse(task.text, parsing_timeout=None)
    extracted = next((p for p in parsed if isinstance(p, str)), None)
    if not parsed or not extracted:
        return Result(0.0, NO_ANSWER)
    if too_costly(extracted):
        return Result(0.0, WRONG_ANSWER, extracted=extracted, detail=too_costly(extracted))
    pred_obj = _sympy_first(parsed)
    for gold in task.golds:
        gold_norm = gold_answer(gold)
        if too_costly(gold_norm):
            continue
        gold_parsed = _parse_gold(gold_norm)
        gold_obj = _sympy_first(gold_parsed)
        if gold_obj is not None and pred_obj is not None and contradicts(gold_obj, pred_obj):
            continue
        if gold_parsed and verify(list(gold_parsed), parsed, timeout_seconds=None):
            return Result(1.0, CORRECT, extracted=extracted)
    as_answer = _compare_answer(Extraction(extracted, "math_verify"), task.golds)
    result = as_answer if isinstance(as_answer, Result) else _verify_pairs(as_answer)
    return result if result.correct else Result(0.0, WRONG_ANSWER, extracted=extracted)


# Answer shapes a new worker parses before its first task: the LaTeX parser's prediction cache is built lazily per
# process, and a cold one made the first hundred non-trivial answers cost 1.5-3x a warm parse (measured on
# bench_math's mix, none of whose answers are here).
_WARM_ANSWERS = (
    r"(1, 2)", r"[0, 1)", r"(-\infty, 3] \cup (4, \infty)", r"\{1, 2, 3\}", r"2\sqrt{3}", r"\frac{\sqrt{5}}{2}",
    r"3\pi", r"\frac{\pi}{4}", r"\pi^2", r"1 + 2i", r"x^2 + 3x - 4", r"2x - 3y + z = 5",
    r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}", r"1 \pm \sqrt{2}",
    r"\sin x", r"\cos^2 \theta", r"\log_2 8", r"e^{x}", r"x = 3", r"\dfrac{3}{4}", r"-\frac{7}{3}", r"\sqrt[3]{2}",
    r"10^{5}", r"3.14", r"50\%", r"\text{even}", r"a + b", r"(3, \frac{\pi}{2})", r"\infty", r"f(x) = 2x",
    r"x \in [2, 5]", r"y = -2x + 1", r"\tan^{-1} 2", r"|x - 1|", r"n!", r"\binom{5}{2}", r"45^\circ",
    r"0.\overline{3}", r"k + 2", r"\frac{a}{b} + c", r"\sqrt{x^2 + 1}", r"2^{10} - 1", r"\left( 1, -\frac{1}{2} \right)",
)  # fmt: skip


def warm_up() -> None:
    """Run math-verify on a spread of answer shapes so a fresh pool worker's parsers are built before its first
    timed task (about a second, once per worker, outside every task's timeout)."""
    from math_verify import parse

    verify_math("\\boxed{\\frac{1}{2}}", '["0.5"]')
    verify_math("\\boxed{(1, 2)}", '["(1,2)"]')
    # math-verify's first comparison of equations, sets, unions and text loads and caches what it needs: ~0.2 s
    verify_math("\\boxed{2x + 3y = 6}", '["2x+3y=5"]')
    verify_math("\\boxed{\\{1 \\pm \\sqrt{2}, 3\\}}", '["\\\\{1\\\\pm\\\\sqrt{3},3\\\\}"]')
    verify_math("\\boxed{(0, 1) \\cup (2, 3)}", '["(0,1)\\\\cup(2,4)"]')
    verify_math("\\boxed{\\text{odd}+1}", '["odd"]')
    for answer in _WARM_ANSWERS:
        parse("\\boxed{" + answer + "}", parsing_timeout=None)
