"""A sympy-free reading of simple answers, so the calling process can reject a wrong answer without the pool.

For `or1.rewards.math`'s fast path. A small grammar of what latex2sympy reads the same way (numbers, `\\frac`,
`\\sqrt`, `\\pi`, single-letter variables, `+ - * ^`, implicit products, parentheses) is evaluated in floating
point; lists, intervals and `pmatrix` vectors are read as the set of their values. When some value of one answer
has no match in the other, no reading of the two as numbers, tuples, sets or intervals makes them equal: as
numbers the numeric veto (`or1.rewards.equivalence`) would overrule math-verify, as functions (variables get the
same values on both sides) they are not identical. Anything outside the grammar, or a difference too small to
be sure of in floating point, is left to sympy (None).
"""

from __future__ import annotations

import cmath
import itertools
import math
import re
from collections.abc import Iterator

# Relative differences below these may be rounding (math-verify rounds decimals; the veto allows 1e-4 for them).
EXACT_MARGIN = 1e-6
DECIMAL_MARGIN = 2e-4
_TOKEN = re.compile(r"\s*(\d+\.\d+|\d+|\\[A-Za-z]+|[A-Za-z]|[-+*/^(){}\[\],&]|\\\\)")
_COMMANDS = {"\\frac", "\\dfrac", "\\tfrac", "\\sqrt", "\\pi", "\\cdot", "\\times", "\\infty"}
_LETTERS = set("abcdefghijklmnopqrstuvwxyzABCDFGHJKLMPRTUVWXYZ")  # E, I, N, O, Q, S may name sympy objects
_PMATRIX = re.compile(r"^\\begin\{pmatrix\}(.*)\\end\{pmatrix\}$", re.DOTALL)
_THOUSANDS = re.compile(r"\d,\s?\d{3}(?!\d)")  # 1,000 may be one number
_PROBES = (
    7 / 3,
    11 / 5,
    13 / 7,
    17 / 11,
    19 / 13,
)  # values for variables, as the numeric veto substitutes them
# e and i may be Euler's number and the imaginary unit, or variables; 1\frac{4}{5} a mixed number or a product:
# an answer is refuted only when its values differ under every reading
_READINGS = {"e": (math.e, 29 / 17), "i": (1j, 31 / 19), "mixed": ("sum", "product")}


class _Outside(ValueError):
    """The answer leaves the grammar: sympy must read it."""


def _tokens(text: str) -> list[str]:
    text = text.replace("\\left", "").replace("\\right", "").strip()
    tokens, at = [], 0
    while at < len(text):
        match = _TOKEN.match(text, at)
        if match is None:
            raise _Outside(text[at:])
        tokens.append(match.group(1))
        at = match.end()
    return tokens


class _Parser:
    """Recursive descent over the tokens of one scalar; nodes are tuples ("num", v), ("var", name), (op, ...)."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.at = tokens, 0

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self, expected: str | None = None) -> str:
        token = self.peek()
        if token is None or (expected is not None and token != expected):
            raise _Outside(f"expected {expected}")
        self.at += 1
        return token

    def sum(self) -> tuple:
        node = self.product()
        while self.peek() in ("+", "-"):
            op = self.take()
            node = ("add", node, self.product() if op == "+" else ("neg", self.product()))
        return node

    def product(self) -> tuple:
        if self.peek() in ("-", "+"):
            sign = self.take()
            node = self.product()
            return ("neg", node) if sign == "-" else node
        node = self.power()
        while True:
            token = self.peek()
            if token in ("*", "\\cdot", "\\times"):
                self.take()
            elif token == "/":
                return self._quotient(node)
            elif token is None or token in ("+", "-", ")", "}", "]", ",", "&", "\\\\", "/", "^"):
                return node
            elif node[0] == "var" and token == "(":
                raise _Outside("a letter before a parenthesis may be a function")
            elif node[0] == "var" and token in _LETTERS:
                raise _Outside("adjacent letters may be one name")
            elif token.isdigit() or "." in token:
                raise _Outside("a number after a factor")
            elif node[0] == "lit" and token in ("\\frac", "\\dfrac", "\\tfrac"):
                node = ("mixed", node, self.power())
                continue
            node = ("mul", node, self.power())

    def _quotient(self, node: tuple) -> tuple:
        """`16/49`: one integer over another and nothing else in the term (what `1/2x` means is not sure)."""
        self.take("/")
        denominator = self.take()
        if (
            node[0] != "lit"
            or not denominator.isdigit()
            or self.peek() not in (None, "+", "-", ",", ")", "]", "}")
        ):
            raise _Outside("a quotient other than integer/integer")
        return ("div", node, ("num", float(denominator)))

    def power(self) -> tuple:
        node = self.atom()
        if self.peek() == "^":
            self.take()
            exponent = self.group() if self.peek() == "{" else ("num", float(self._digit()))
            if self.peek() == "^":
                raise _Outside("stacked powers")
            node = ("pow", node, exponent)
        return node

    def _digit(self) -> str:
        token = self.take()
        if not token.isdigit():
            raise _Outside("exponent")
        if len(token) > 1:  # x^23 is x^2 * 3 to LaTeX; keep only what is unambiguous
            raise _Outside("multi-digit bare exponent")
        return token

    def group(self) -> tuple:
        self.take("{")
        node = self.sum()
        self.take("}")
        return node

    def _argument(self) -> tuple:
        """A \\frac or \\sqrt argument: a braced group or one bare digit (\\frac12, \\sqrt2)."""
        if self.peek() == "{":
            return self.group()
        token = self.take()
        if not token.isdigit() or len(token) != 1:
            raise _Outside("bare \\frac argument")
        return ("num", float(token))

    def atom(self) -> tuple:
        token = self.take()
        if token.isdigit() or "." in token:
            if len(token) > 30:
                raise _Outside("long number")
            return ("lit", float(token))  # a numeral as written (a mixed number starts with one)
        if token in _LETTERS:
            return ("var", token)
        if token == "(":
            node = self.sum()
            self.take(")")
            return node
        if token == "{":
            self.at -= 1
            return self.group()
        if token in ("\\frac", "\\dfrac", "\\tfrac"):
            return ("div", self._argument(), self._argument())
        if token == "\\sqrt":
            if self.peek() == "[":
                raise _Outside("nth root")
            return ("sqrt", self._argument())
        if token == "\\pi":
            return ("num", math.pi)
        raise _Outside(f"token {token}")


def _evaluate(node: tuple, env: dict) -> complex | float:
    kind = node[0]
    if kind in ("num", "lit"):
        return node[1]
    if kind == "var":
        return env[node[1]]
    if kind == "neg":
        return -_evaluate(node[1], env)
    if kind == "sqrt":
        value = _evaluate(node[1], env)
        if isinstance(value, complex) or value < 0:
            raise _Outside("square root of a negative or complex number")
        return math.sqrt(value)
    a, b = _evaluate(node[1], env), _evaluate(node[2], env)
    if kind == "add":
        return a + b
    if kind == "mul" or (kind == "mixed" and env["mixed"] == "product"):
        return a * b
    if kind == "mixed":
        return a + b
    if kind == "div":
        if b == 0:  # sympy's complex infinity: it matches no number, only infinities (see `_close`)
            return math.inf if a != 0 else math.nan
        return a / b
    if isinstance(b, complex) or b != int(b) or abs(b) > 64 or (a == 0 and b < 0):
        raise _Outside("power")  # fractional powers of negatives are complex; big ones overflow
    return a**b


def _names(node: tuple) -> set[str]:
    """The variables of a tree, and "mixed" when it holds a mixed number."""
    if node[0] == "var":
        return {node[1]}
    own = {"mixed"} if node[0] == "mixed" else set()
    return own.union(*(_names(child) for child in node[1:] if isinstance(child, tuple)))


def _elements(text: str) -> list[list[str]]:
    """The tokens of each element: one for a scalar, several for a list, an interval or a column of a pmatrix."""
    matrix = _PMATRIX.match(text.strip())
    if matrix:
        return [
            _tokens(cell) for row in matrix.group(1).split("\\\\") for cell in row.split("&") if cell.strip()
        ]
    if "\\begin" in text or "\\cup" in text or "\\pm" in text or _THOUSANDS.search(text):
        raise _Outside("structure")
    tokens = _tokens(text)
    if tokens and tokens[0] in ("(", "[") and tokens[-1] in (")", "]") and "," in tokens:
        tokens = tokens[1:-1]
    elements, depth, current = [], 0, []
    for token in tokens:
        if token in ("(", "{", "["):
            depth += 1
        elif token in (")", "}", "]"):
            depth -= 1
        if token == "," and depth == 0:
            elements.append(current)
            current = []
        else:
            current.append(token)
    return [*elements, current]


def _read(text: str) -> list[tuple]:
    trees = []
    for tokens in _elements(text):
        if tokens in (["\\infty"], ["-", "\\infty"], ["+", "\\infty"]):
            trees.append(("num", -math.inf if tokens[0] == "-" else math.inf))
            continue
        parser = _Parser(tokens)
        trees.append(parser.sum())
        if parser.peek() is not None:
            raise _Outside("trailing tokens")
    return trees


def _close(a: complex | float, b: complex | float, margin: float) -> bool:
    if _infinite(a) or _infinite(b):
        return _infinite(a) and _infinite(b)  # signs aside: -oo, oo and zoo are not told apart here
    return abs(a - b) <= margin * max(abs(a), abs(b), 1e-12)


def _infinite(value: complex | float) -> bool:
    return isinstance(value, float) and math.isinf(value)


def _unmatched(gold: list, pred: list, margin: float) -> bool:
    """Whether a value of either list has no close value in the other."""
    return any(not any(_close(g, p, margin) for p in pred) for g in gold) or any(
        not any(_close(g, p, margin) for g in gold) for p in pred
    )


def _environments(names: set[str]) -> Iterator[dict]:
    """One environment per reading of the ambiguous names; plain variables get the probe values."""
    plain = sorted(names - set(_READINGS))
    env = {name: _PROBES[i % len(_PROBES)] for i, name in enumerate(plain)}
    ambiguous = sorted(names & set(_READINGS))
    for choice in itertools.product(*(_READINGS[name] for name in ambiguous)):
        yield {**env, **dict(zip(ambiguous, choice, strict=True))}


def values_differ(gold: str, pred: str) -> bool | None:
    """True when some value of one answer has no match among the other's (see the module docstring); None when
    either answer is outside the grammar or the values are within rounding of each other."""
    margin = DECIMAL_MARGIN if "." in gold + pred else EXACT_MARGIN
    try:
        gold_trees, pred_trees = _read(gold), _read(pred)
        for env in _environments(set().union(*map(_names, gold_trees + pred_trees))):
            gold_values = [_evaluate(t, env) for t in gold_trees]
            pred_values = [_evaluate(t, env) for t in pred_trees]
            if any(cmath.isnan(v) for v in gold_values + pred_values):
                return None
            if not _unmatched(gold_values, pred_values, margin):
                return None
    except (_Outside, OverflowError, ZeroDivisionError, RecursionError):
        return None
    return True
