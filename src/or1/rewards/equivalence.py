"""A second opinion on math-verify's "equal": catch pairs it calls equal that differ numerically.

math-verify compares exact values with `(a - b).evalf(chop=True) == 0`, which chops tiny differences to zero
(`1/2^99` equals `1/2^98`), and rounds floats to 6 decimals (`0.0000012` equals `0.0000014`). `contradicts` walks
the two parsed answers side by side and evaluates corresponding numbers at high precision, with the same values
substituted for any free symbols; it runs inside a pool worker, so its cost is bounded by the task timeout.
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy import Basic, Float, Interval, MatrixBase, Rational
from sympy.core.relational import Relational
from sympy.sets.sets import FiniteSet

from or1.rewards.normalize import EXACT_RTOL as _EXACT_RTOL

EXACT_RTOL = sympy.Rational(_EXACT_RTOL.numerator, _EXACT_RTOL.denominator)  # 12 significant digits
FLOAT_RTOL = 1e-4  # a decimal answer may be rounded, but not to a different leading figure
_PRECISION = 60
_UNEVALUATED = (sympy.Sum, sympy.Integral, sympy.Product, sympy.Limit)
_PROBE_VALUES = (Rational(7, 3), Rational(11, 5), Rational(13, 7), Rational(17, 11), Rational(19, 13))


def _substitute(expr: Basic, symbols: list[sympy.Symbol]) -> Basic:
    """The same fixed, generic values for the same symbols in both answers, so they compare as numbers."""
    return expr.subs({sym: _PROBE_VALUES[i % len(_PROBE_VALUES)] for i, sym in enumerate(symbols)})


def _numeric_differ(gold: Basic, pred: Basic, symbols: list[sympy.Symbol]) -> bool:
    """Whether two scalar expressions evaluate to numbers that differ beyond rounding."""
    if gold.has(*_UNEVALUATED) or pred.has(*_UNEVALUATED):
        return False  # sums, integrals, products, limits over symbols: evalf is slow, no evidence either way
    try:
        a = _substitute(gold, symbols).evalf(_PRECISION)
        b = _substitute(pred, symbols).evalf(_PRECISION)
        if not (a.is_number and b.is_number) or a.has(sympy.zoo, sympy.nan) or b.has(sympy.zoo, sympy.nan):
            return False  # not numbers (undefined functions, infinities): no evidence against math-verify
        scale = max(abs(a), abs(b))
        if scale == 0:
            return False
        rtol = FLOAT_RTOL if gold.has(Float) or pred.has(Float) else EXACT_RTOL
        return bool(abs(a - b) > rtol * scale)
    except (TypeError, ValueError, ArithmeticError, AttributeError, RecursionError):
        return False


def _sorted_items(items: tuple[Any, ...]) -> list[Any]:
    """Set elements in numeric order, so that {1/2^98, 2} lines up with {2, 1/2^99}.

    A labelled element (`x_1 = 3`) sorts by its value, so {x = -5, p = 14/3} lines up with {-5, 14/3}.
    """

    def key(item: Any) -> tuple[int, Any]:
        value = item.rhs if isinstance(item, Relational) and item.lhs.is_Symbol else item
        try:
            return (0, float(sympy.re(value.evalf(30))))
        except (TypeError, ValueError, AttributeError):
            return (1, str(item))

    return sorted(items, key=key)


def _has_percent(obj: Any) -> bool:
    """latex2sympy spells `x\\%` as `x * UnevaluatedExpr(1/100)`."""
    return isinstance(obj, Basic) and obj.has(sympy.UnevaluatedExpr)


def contradicts(gold: Any, pred: Any, symbols: list[sympy.Symbol] | None = None) -> bool:
    """True when `gold` and `pred` (parsed sympy answers math-verify called equal) provably differ in value."""
    if _has_percent(gold) or _has_percent(pred):
        return False  # math-verify lets 28% equal 28 on purpose; a percent answer gets no second opinion
    if symbols is None:
        free = set()
        for obj in (gold, pred):
            free |= getattr(obj, "free_symbols", set())
        symbols = sorted(free, key=str)
    if isinstance(gold, Relational) and isinstance(pred, Relational):
        if gold.lhs == pred.lhs:
            return contradicts(gold.rhs, pred.rhs, symbols)
        return False
    if isinstance(gold, Relational) and gold.lhs.is_Symbol:
        return contradicts(gold.rhs, pred, symbols)
    if isinstance(pred, Relational) and pred.lhs.is_Symbol:
        return contradicts(gold, pred.rhs, symbols)
    if isinstance(gold, MatrixBase) and isinstance(pred, MatrixBase):
        if gold.shape != pred.shape:
            return False
        return any(contradicts(a, b, symbols) for a, b in zip(gold, pred, strict=True))
    if isinstance(gold, Interval) and isinstance(pred, Interval):
        return contradicts(gold.start, pred.start, symbols) or contradicts(gold.end, pred.end, symbols)
    if isinstance(gold, (FiniteSet, sympy.Tuple)) and isinstance(pred, (FiniteSet, sympy.Tuple)):
        if len(gold.args) != len(pred.args):
            return False
        both_tuples = isinstance(gold, sympy.Tuple) and isinstance(pred, sympy.Tuple)
        g_items = list(gold.args) if both_tuples else _sorted_items(gold.args)
        p_items = list(pred.args) if both_tuples else _sorted_items(pred.args)
        return any(contradicts(a, b, symbols) for a, b in zip(g_items, p_items, strict=True))
    if isinstance(gold, sympy.Expr) and isinstance(pred, sympy.Expr):
        return _numeric_differ(gold, pred, symbols)
    return False
