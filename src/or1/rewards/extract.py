"""Find the final answer in a model response, for the math reward.

Only the text after the last `</think>` counts (the whole text when the tag is missing). The answer is the last
complete `\\boxed{...}` / `\\fbox{...}`, else an explicit "final answer is X" / "Answer: X" statement, else none.
Every step is linear in the response length and bounded by `MAX_ANSWER_CHARS`, so hostile responses stay cheap.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

THINK_END = "</think>"
MAX_ANSWER_CHARS = 1000  # longer "answers" are degenerate output, and sympy time grows with length
MAX_BRACE_DEPTH = 40  # deeper nesting (thousands of \frac) would exhaust latex2sympy's recursive parser
_BOX_CANDIDATES = 3  # how many trailing \boxed occurrences to try when the last one is unclosed
_STATEMENT_WINDOW = 4000  # a final-answer statement sits at the end; only the tail is searched

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_STATEMENT_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|:)|the\s+answer\s+is|\banswer\s*(?:is|:))\s*:?\s*",
    re.IGNORECASE,
)
_MATH_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))


@dataclass(frozen=True)
class Extraction:
    """The answer text found in a response and how it was found (`boxed` or `statement`)."""

    answer: str
    kind: str


class AnswerTooComplex(ValueError):
    """The box holds more than a final answer can: too long or nested too deep. Scored as a wrong answer."""


def final_region(response: str) -> str:
    """The part of `response` that is graded: everything after the last `</think>`."""
    cut = response.rfind(THINK_END)
    return response if cut < 0 else response[cut + len(THINK_END) :]


def _balanced_body(text: str, start: int) -> str | None:
    """Text from `start` up to the brace that closes an already-open `{`; None if unclosed within the caps."""
    depth = 1
    limit = min(len(text), start + MAX_ANSWER_CHARS + 1)
    i = start
    while i < limit:
        ch = text[i]
        if ch == "\\":
            i += 2  # \{ and \} are literal braces (set notation), and \\ is a line break: skip the escaped char
            continue
        if ch == "{":
            depth += 1
            if depth > MAX_BRACE_DEPTH:
                raise AnswerTooComplex(f"answer nests braces deeper than {MAX_BRACE_DEPTH}")
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    if limit < len(text):
        raise AnswerTooComplex(f"boxed answer longer than {MAX_ANSWER_CHARS} characters")
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete `\\boxed{...}`/`\\fbox{...}`; raises AnswerTooComplex for oversized boxes."""
    starts = [m.end() for m in _BOX_RE.finditer(text)]
    too_complex: AnswerTooComplex | None = None
    for start in reversed(starts[-_BOX_CANDIDATES:]):
        try:
            body = _balanced_body(text, start)
        except AnswerTooComplex as err:
            too_complex = too_complex or err
            continue
        if body is not None:
            return body
    if too_complex is not None:
        raise too_complex
    return None


def _statement_answer(rest: str) -> str:
    """The answer right after "final answer is": one math span if it starts with one, else up to the sentence end."""
    rest = rest.lstrip().lstrip("*").lstrip()  # markdown bold: **Answer:** X
    for open_, close in _MATH_DELIMS:
        if rest.startswith(open_):
            end = rest.find(close, len(open_))
            if end > 0:
                return rest[len(open_) : end]
    line = rest.split("\n", 1)[0]
    sentence = re.split(r"\.(?:\s|$)", line, maxsplit=1)[0]
    return sentence.strip().rstrip(".")


def statement_answer(text: str) -> str | None:
    """The answer of the last "final answer is X" / "Answer: X" statement in the tail of `text`, if any."""
    tail = text[-_STATEMENT_WINDOW:]
    matches = list(_STATEMENT_RE.finditer(tail))
    for match in reversed(matches):
        answer = _statement_answer(tail[match.end() :])
        if answer:
            if len(answer) > MAX_ANSWER_CHARS:
                raise AnswerTooComplex(f"stated answer longer than {MAX_ANSWER_CHARS} characters")
            return answer
    return None


def extract_answer(response: str) -> Extraction | None:
    """The final answer of `response` (after the last `</think>`), or None when it states none."""
    text = final_region(response).replace("\x00", "")
    boxed = last_boxed(text)
    if boxed is not None and boxed.strip():
        return Extraction(boxed.strip(), "boxed")
    stated = statement_answer(text)
    if stated is not None:
        return Extraction(stated, "statement")
    return None
