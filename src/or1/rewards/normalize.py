"""Answer normalisation for the math reward: the rewrites AIME/MATH graders apply and math-verify misses.

Used by `or1.rewards.math` on both the extracted answer and every ground truth before comparison. Everything here
is plain string work (no sympy), so it is cheap enough to run before the process pool's fast path.
"""

from __future__ import annotations

import json
import math
import re
from fractions import Fraction

MAX_DIGITS = 400  # integers longer than this are not contest answers; sympy arithmetic on them gets slow
MAX_POWER_DIGITS = 2000  # a numeric power tower whose value would have more digits than this is rejected

_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad\b|~")  # not the space after a \\ row break
_LEFT_RIGHT = re.compile(r"\\(?:left|right|bigl|bigr|Bigl|Bigr|big|Big)\b\s*")
_FRAC_VARIANTS = re.compile(r"\\[dtc]frac\b")
_DEGREES = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b|\\textdegree\b")
_TEXT_CMD = r"\\(?:text|textbf|textrm|mathrm|mbox|rm|textit)\s*\{([^{}]*)\}"
_TRAILING_TEXT = re.compile(r"^(?P<math>.*?[\d}).])\s*(?:" + _TEXT_CMD + r"\s*)+(?:\^\s*\{?\d\}?)?$")
_ONLY_TEXT = re.compile(r"^" + _TEXT_CMD + r"$")
_CURRENCY = re.compile(r"\\\$|\$|\\euro\b|€|£|¥|\bUSD\b|\bdollars?\b|\bcents?\b")
_THOUSANDS_BRACED = re.compile(r"(\d)\{,\}(\d{3})")
_THOUSANDS = re.compile(r"^[+-]?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")  # "0,111" is no thousands grouping
_DECIMAL_COMMA = re.compile(r"^[+-]?\d+,\d+$")
_LIST_COMMA = re.compile(r",[ \t\n]")  # a comma and a real space separate list items, not thousands
_LHS_VARIABLE = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=\s*(?P<rhs>[^=<>]+)$")
_PLAIN_NUMBER = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)$")
_INTEGER = re.compile(r"^[+-]?\d+$")
# \frac{a}{b}, \dfrac12, \frac9{19}, -\frac{3}{4}, 3/4: integer over integer, as latex2sympy reads them
_FRACTION = re.compile(
    r"^(?P<sign>[+-]?)(?:\\[dt]?frac(?:\{(?P<a>[+-]?\d+)\}|(?P<a1>\d))(?:\{(?P<b>[+-]?\d+)\}|(?P<b1>\d))"
    r"|(?P<c>\d+)/(?P<d>\d+))$"
)
# exact answers must agree to 12 significant digits (the numeric veto's tolerance)
EXACT_RTOL = Fraction(1, 10**12)
_PERCENT = re.compile(r"\\?%$")
_SQRT_PARENS = re.compile(r"\\sqrt\s*\(([^()]*)\)")
_MATHRM_LETTER = re.compile(r"\\(?:mathrm|text|rm)\s*\{\s*([A-Za-z])\s*\}")
_LONG_NUMBER = re.compile(rf"\d{{{MAX_DIGITS + 1},}}")
_TOWER = re.compile(r"\d+(?:\^\d+)+")


class BadGroundTruth(ValueError):
    """A ground truth that is not a usable list of answers (empty, not text). The row is bad input."""


def parse_ground_truth(ground_truth: object) -> list[str]:
    """The acceptable answers in a ground truth: a JSON list of answers, a JSON scalar, or a plain string."""
    if isinstance(ground_truth, (list, tuple)):
        items: list[object] = list(ground_truth)
    elif isinstance(ground_truth, str):
        try:
            decoded = json.loads(ground_truth)
        except ValueError:
            decoded = ground_truth  # a plain string that is not JSON is one answer
        items = list(decoded) if isinstance(decoded, list) else [decoded]
    elif isinstance(ground_truth, (int, float)) and not isinstance(ground_truth, bool):
        items = [ground_truth]
    else:
        raise BadGroundTruth(f"ground truth must be a string or list, got {type(ground_truth).__name__}")
    answers = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise BadGroundTruth(f"ground truth answers must be strings, got {type(item).__name__}")
        text = str(item).strip()
        if text:
            answers.append(text)
    if not answers:
        raise BadGroundTruth("ground truth holds no answer")
    return answers


def _strip_delimiters(text: str) -> str:
    """Drop the math-mode delimiters and a trailing full stop around an answer."""
    text = text.strip().rstrip(".").strip()
    for open_, close in (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")):
        if text.startswith(open_) and text.endswith(close) and len(text) >= len(open_) + len(close):
            text = text[len(open_) : len(text) - len(close)].strip()
    return text


def _strip_units(text: str) -> str:
    """Drop trailing `\\text{...}` units (`10\\text{ cm}^2`) and unwrap an answer that is only text."""
    only = _ONLY_TEXT.match(text)
    if only:
        return only.group(1).strip()
    trailing = _TRAILING_TEXT.match(text)
    return trailing.group("math").strip() if trailing else text


def _strip_lhs(text: str) -> str:
    """`x = 5` -> `5`: a single variable on the left is a label, not part of the answer."""
    match = _LHS_VARIABLE.match(text)
    if match and "," not in match.group("rhs"):
        return match.group("rhs").strip()
    return text


def normalize_answer(text: str, *, strip_lhs: bool = True) -> str:
    """The canonical spelling of one answer, for both gold and prediction (see the module docstring).

    `strip_lhs=False` keeps `y = 2x + 1` whole, for comparing with a gold that is itself an equation.
    """
    text = _strip_delimiters(text.replace("\x00", ""))
    listed = _LIST_COMMA.search(text)  # "32, 349" is two numbers; "32,349" and "32,\\!349" are one
    text = _SPACING.sub(" ", text)
    text = _LEFT_RIGHT.sub("", text)
    text = _FRAC_VARIANTS.sub(r"\\frac", text)
    text = _SQRT_PARENS.sub(r"\\sqrt{\1}", text)
    text = _MATHRM_LETTER.sub(r"\1", text)
    text = _DEGREES.sub("", text)
    text = _strip_units(text.strip())
    text = _CURRENCY.sub("", text).strip()
    text = _THOUSANDS_BRACED.sub(r"\1\2", text)
    text = re.sub(r"\s+", " ", text).strip()
    if not listed and _THOUSANDS.match(text.replace(" ", "")):
        text = text.replace(",", "")
    if strip_lhs:
        text = _strip_lhs(text)
    number = plain_number(text)
    if number is not None and number.denominator == 1:
        text = str(number.numerator)  # "025" and "25.0" are the integer 25, as AIME graders read them
    return text


def decimal_comma_reading(text: str) -> str | None:
    """`1,22` / `0,111` read with a decimal comma (`1.22`, `0.111`), as math-verify reads such numbers; else None.

    For golds only, as a second acceptable answer: "1,22" may as well be the pair 1 and 22.
    """
    text = text.strip()
    if not _DECIMAL_COMMA.match(text) or _THOUSANDS.match(text):
        return None
    return text.replace(",", ".")


def plain_number(text: str) -> Fraction | None:
    """The exact value of a plain decimal numeral ("025", "-3.50", ".4"), else None."""
    compact = text.replace(" ", "")
    if not _PLAIN_NUMBER.match(compact) or len(compact) > MAX_DIGITS:
        return None
    return Fraction(compact)


def exact_rational(text: str) -> Fraction | None:
    """The value of an integer or a fraction of integers (`\\frac{3}{4}`, `\\dfrac12`, `3/4`), else None.

    Decimals are left out on purpose: math-verify rounds them (0.333333 may equal 1/3), so only sympy judges them
    against a fraction.
    """
    compact = text.replace(" ", "")
    if len(compact) > MAX_DIGITS:
        return None
    if _INTEGER.match(compact):
        return Fraction(compact)
    match = _FRACTION.match(compact)
    if match is None:
        return None
    top = match["a"] or match["a1"] or match["c"]
    bottom = int(match["b"] or match["b1"] or match["d"])
    if bottom == 0:
        return None
    value = Fraction(int(top), bottom)
    return -value if match["sign"] == "-" else value


def has_percent(text: str) -> bool:
    """Whether an answer ends in a percent sign (then 50% may equal 0.5, so the fast path must not judge it)."""
    return bool(_PERCENT.search(text.strip().rstrip(".").rstrip("$").strip()))


def too_costly(text: str) -> str | None:
    """Why sympy must not see `text` (huge integers, numeric power towers), or None when it is safe to parse."""
    if _LONG_NUMBER.search(text):
        return f"number with more than {MAX_DIGITS} digits"
    if _tower_digits(text) > MAX_POWER_DIGITS:
        return f"power whose value has more than {MAX_POWER_DIGITS} digits"
    if re.search(r"\d{6,}\s*!", text):
        return "factorial of a number above 99999"
    return None


def _tower_digits(text: str) -> float:
    """Upper estimate of the decimal digits of the largest numeric power tower `a^{b^{c}}` in `text`."""
    flat = re.sub(r"[{}\s]", "", text)  # 9^{9^{9}} -> 9^9^9; only over-estimates, never misses a tower
    worst = 0.0
    for match in _TOWER.finditer(flat):
        chain = [int(part[-MAX_DIGITS:]) for part in match.group(0).split("^")]
        log10_value = math.log10(max(chain[-1], 1))
        for base in reversed(chain[:-1]):
            exponent = 10.0**log10_value if log10_value < 300 else math.inf
            log10_value = exponent * math.log10(base) if base > 1 else 0.0
        worst = max(worst, log10_value)
    return worst
