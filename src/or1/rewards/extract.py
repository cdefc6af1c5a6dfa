"""Find the final answer in a model response, for the math reward.

Only the text after the last `</think>` counts (the whole text when the tag is missing). In that order:
1. the last complete `\\boxed{...}` / `\\fbox{...}`; when it closes a run of boxes (`\\boxed{1}, \\boxed{2}`,
   `\\boxed{(2,2)} and \\boxed{(6,2)}`), the run's answers together, as math-verify combines them (kind `boxes`);
2. else an explicit "final answer is X" / "Answer: X" statement (kind `statement`);
3. else, in the default extraction mode, math-verify's own extraction of the text (`fallback_text`; it needs sympy,
   so `or1.rewards.math` runs it in the pool), which finds an answer in `$...$`, `\\[...\\]` or plain text, as
   Skywork-OR1's reward does. `EXTRACTION_MODES` names the stricter modes (statement: 1-2; boxed: 1 only).
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
FALLBACK_WINDOW = 8000  # characters of the graded text's tail that math-verify's own extraction reads
_RUN_NEAR, _RUN_FAR = 10, 70  # gaps between the boxes of one answer (math-verify's rule, see `boxed_run`)
# Extraction modes of reward.math_extraction: how far the search goes before a response has no answer.
EXTRACTION_MODES = ("math_verify", "statement", "boxed")

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_STATEMENT_RE = re.compile(
    r"(?:final\s+answer\s*(?:is|:)|the\s+answer\s+is|\banswer\s*(?:is|:))\s*:?\s*",
    re.IGNORECASE,
)
_MATH_DELIMS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_LONE_MATH = re.compile(r"^\s*(\$\$([^$]+)\$\$|\$([^$]+)\$|\\\((.+?)\\\)|\\\[(.+?)\\\])\s*\.?\s*$", re.DOTALL)
# math-verify's first choice: Minerva's "Final Answer: The final answer is X. I hope it is correct."
_MATH_START = re.compile(r"[\d$\\\[]")  # a character some pattern of math-verify's extraction starts from
_MINERVA = re.compile(r"final\s+answer\s+is\s*:?\s*(.+?)\.?\s*I\s+hope", re.IGNORECASE | re.DOTALL)
_RUN_SEPARATOR = re.compile(r"\b(?:and|or)\b|,|;")
_SPAN_EDGE = re.compile(r"\$|\\[()\[\]]")  # a math span opens or closes between two boxes
_SPAN_SEPARATOR = re.compile(r"\s*(?:,?\s*(?:and|or)|,)\s*")  # what joins boxes in separate spans


@dataclass(frozen=True)
class Extraction:
    """The answer text found in a response and how it was found (`boxed` or `statement`)."""

    answer: str
    kind: str  # boxed, boxes (several connected boxes, joined by ", "), statement, math_verify (its own extraction)
    parts: tuple[str, ...] = ()  # the boxes' answers, for kind boxes
    # for kind statement: the text from the statement's keyword on ("Final answer: ... is 34.")
    context: str = ""


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


def _last_complete_box(text: str, boxes: list[re.Match[str]]) -> int | None:
    """Index in `boxes` of the last complete box (trying the last few); raises AnswerTooComplex for oversized ones."""
    too_complex: AnswerTooComplex | None = None
    for index in reversed(range(max(0, len(boxes) - _BOX_CANDIDATES), len(boxes))):
        try:
            body = _balanced_body(text, boxes[index].end())
        except AnswerTooComplex as err:
            too_complex = too_complex or err
            continue
        if body is not None:
            return index
    if too_complex is not None:
        raise too_complex
    return None


def boxed_run(text: str) -> list[str]:
    """The answers of the run of boxes that ends with the last complete box (one item for a lone box).

    The rule of math-verify's box extraction (latex2sympy2_extended's `extract_boxed_content`), walking back from
    the last box: an earlier box joins the run when fewer than 10 characters separate it from the next one, or when
    fewer than 70 do, they hold a `,` / `;` / `and` / `or`, and its content differs; repeated contents count once.
    Boxes in separate math spans (`$...$`) join only when nothing but `,` / `and` / `or` lies between the spans, as
    math-verify's span matching does: an intermediate boxed value earlier in the text is not part of the answer.
    """
    boxes = list(_BOX_RE.finditer(text))
    index = _last_complete_box(text, boxes)
    if index is None:
        return []
    bodies = [(_balanced_body(text, boxes[index].end()) or "").strip()]
    next_start, total = boxes[index].start(), len(bodies[0])
    for prev in reversed(range(index)):
        try:
            body = _balanced_body(text, boxes[prev].end())
        except AnswerTooComplex:
            break
        closing = boxes[prev].end() + len(body) if body is not None else next_start
        if body is None or closing >= next_start:
            break  # unclosed, or a box around the next one
        gap, content = text[closing + 1 : next_start], body.strip()
        if _SPAN_EDGE.search(
            gap
        ):  # "$x = \boxed{3}$, so the area is $\boxed{5}$": the last span is the answer
            if not _SPAN_SEPARATOR.fullmatch(_SPAN_EDGE.sub("", gap)):
                break
        elif len(gap) >= _RUN_NEAR and (
            content == bodies[-1] or len(gap) >= _RUN_FAR or not _RUN_SEPARATOR.search(gap)
        ):
            break
        if content != bodies[-1]:
            bodies.append(content)
            total += len(content) + 2
            if total > MAX_ANSWER_CHARS:
                raise AnswerTooComplex(f"boxed answers longer than {MAX_ANSWER_CHARS} characters together")
        next_start = boxes[prev].start()
    return bodies[::-1]


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


def _minerva(text: str) -> Extraction | None:
    """Minerva's final-answer sentence when it comes after every box (math-verify ranks it above boxes)."""
    tail = text[-_STATEMENT_WINDOW:]
    matches = list(_MINERVA.finditer(tail))
    match = matches[-1] if matches else None
    if match is None or _BOX_RE.search(tail, match.start()):
        return None
    answer = _statement_answer(match.group(1))
    if not answer or len(answer) > MAX_ANSWER_CHARS:
        return None
    return Extraction(answer, "statement", context=tail[match.start() :])


def _statement(text: str) -> tuple[str, str] | None:
    """(answer, the statement from its keyword on) of the last answer statement in the tail of `text`."""
    tail = text[-_STATEMENT_WINDOW:]
    matches = list(_STATEMENT_RE.finditer(tail))
    for match in reversed(matches):
        answer = _statement_answer(tail[match.end() :])
        if answer:
            if len(answer) > MAX_ANSWER_CHARS:
                raise AnswerTooComplex(f"stated answer longer than {MAX_ANSWER_CHARS} characters")
            return answer, tail[match.start() :]
    return None


def extract_answer(response: str, mode: str = "math_verify") -> Extraction | None:
    """The boxed or stated final answer of `response` (after the last `</think>`), or None when it has neither.

    `mode` boxed looks at boxes only; statement and math_verify also at answer statements (math_verify then falls
    back to math-verify's own extraction of `fallback_text`, which the caller runs: it needs sympy).
    """
    if mode not in EXTRACTION_MODES:
        raise ValueError(f"unknown math extraction mode {mode!r}; expected one of {EXTRACTION_MODES}")
    text = final_region(response).replace("\x00", "")
    minerva = _minerva(text)
    if minerva is not None:
        return minerva
    run = [body.strip() for body in boxed_run(text)]
    if len(run) > 1 and all(run):
        return Extraction(", ".join(run), "boxes", tuple(run))
    if run and run[-1]:
        return Extraction(run[-1], "boxed")
    if mode == "boxed":
        return None
    stated = _statement(text)
    if stated is not None:
        return Extraction(stated[0], "statement", context=stated[1])
    return None


def lone_math(text: str) -> str | None:
    """The formula when `text` is nothing but one `$...$` / `\\(...\\)` / `\\[...\\]` span (and a full stop)."""
    match = _LONE_MATH.match(text)
    if match is None or len(text) > MAX_ANSWER_CHARS:
        return None
    body = next(g for g in match.groups()[1:] if g is not None)
    return body.strip() or None


def fallback_text(response: str) -> str | None:
    """What math-verify's own extraction reads when a response has no box and no statement: the graded text's tail.

    None when it could find nothing there: every pattern of its default extraction (LaTeX spans, boxes, bare
    fractions, numbers and expressions) needs a digit, `$`, a backslash or `[`, so text without any is decided
    (no answer) in the calling process instead of costing a round trip to the pool.
    """
    text = final_region(response).replace("\x00", "")[-FALLBACK_WINDOW:]
    return text if _MATH_START.search(text) else None
