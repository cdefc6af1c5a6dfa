"""Code ground truths: parse the three test forms into test cases, and compare outputs on the host.

The forms (a JSON object in `reward_model.ground_truth`, see `or1.data.rows`): stdin/stdout (`inputs`, `outputs`
as text), call-based (the same lists plus `fn_name`; each input a JSON list of arguments) and assert-based
(`import_prefix`, `test_code` defining `check(candidate)`, `entry_point`).

For the code reward (or1.rewards.code). Everything here runs in the trusted parent process: the sandbox only
reports what a program printed or returned, and these functions decide whether that matches.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

MAX_RESULT_CHARS = 64 << 20  # a call result larger than this is wrong, never parsed


@dataclass(frozen=True)
class StdinCase:
    """Feed `stdin`, expect `stdout` (compared line by line, numbers token-wise)."""

    stdin: str
    stdout: str


@dataclass(frozen=True)
class CallCase:
    """Call `fn_name(*args)`; expect the return value `expected` (plain JSON data)."""

    fn_name: str
    args: list
    expected: Any


@dataclass(frozen=True)
class AssertCase:
    """Run `prefix`, the program and `test_code`, then `check(entry_point)` must return."""

    prefix: str
    test_code: str
    entry_point: str


Case = StdinCase | CallCase | AssertCase


def parse_ground_truth(ground_truth: str | Mapping) -> list[Case]:
    """The test cases of a code ground truth (JSON string or dict); ValueError says what is wrong with it."""
    if isinstance(ground_truth, str | bytes):
        try:
            ground_truth = json.loads(ground_truth)
        except ValueError as exc:
            raise ValueError(f"ground truth is not JSON: {exc}") from None
    if not isinstance(ground_truth, Mapping):
        raise ValueError("ground truth must be a JSON object")
    gt = {k: v for k, v in ground_truth.items() if v is not None}  # datasets.map fills missing keys with None
    if "test_code" in gt or "entry_point" in gt:
        return [_assert_case(gt)]
    inputs, outputs = gt.get("inputs"), gt.get("outputs")
    if not isinstance(inputs, list) or not isinstance(outputs, list) or len(inputs) != len(outputs):
        raise ValueError("ground truth needs lists `inputs` and `outputs` of equal length")
    if not inputs:
        raise ValueError("ground truth has no tests")
    if "fn_name" in gt:
        fn_name = gt["fn_name"]
        if not isinstance(fn_name, str) or not fn_name.isidentifier():
            raise ValueError(f"fn_name must be an identifier, got {fn_name!r}")
        return [_call_case(fn_name, i, o) for i, o in zip(inputs, outputs, strict=True)]
    return [StdinCase(_text(i), _text(o)) for i, o in zip(inputs, outputs, strict=True)]


def _assert_case(gt: dict) -> AssertCase:
    fields = {k: gt.get(k, "") for k in ("import_prefix", "test_code", "entry_point")}
    if (
        not all(isinstance(v, str) for v in fields.values())
        or not fields["test_code"]
        or not fields["entry_point"]
    ):
        raise ValueError("assert-based ground truth needs strings test_code and entry_point")
    return AssertCase(fields["import_prefix"], fields["test_code"], fields["entry_point"])


def _call_case(fn_name: str, given: Any, expected: Any) -> CallCase:
    if isinstance(given, str):  # LiveCodeBench: one JSON value per line, output the JSON of the return value
        try:
            args = [json.loads(line) for line in given.split("\n") if line.strip()]
            value = json.loads(expected) if isinstance(expected, str) else expected
        except ValueError as exc:
            raise ValueError(f"call-based test is not JSON per line: {exc}") from None
        return CallCase(fn_name, args, value)
    if isinstance(
        given, list
    ):  # TACO: a list of arguments, output a one-element list holding the return value
        value = expected[0] if isinstance(expected, list) and len(expected) == 1 else expected
        return CallCase(fn_name, given, value)
    raise ValueError(f"call-based input must be a string or a list, got {type(given).__name__}")


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # some TACO rows store lines
        return "\n".join(value)
    raise ValueError(f"stdin/stdout tests must be strings, got {type(value).__name__}")


# ---------------------------------------------------------------- comparison (host side only)
def _lines(text: str) -> list[str]:
    # empty lines are ignored, as Skywork-OR1's TACO checker does: real TACO outputs carry stray blank lines
    return [line for line in (raw.rstrip() for raw in text.split("\n")) if line]


def _number(token: str) -> Decimal | None:
    try:
        value = Decimal(token)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def _same_token(got: str, want: str) -> bool:
    if got == want:
        return True
    a, b = _number(got), _number(want)
    return a is not None and b is not None and a == b


def same_stdout(got: str, want: str) -> bool:
    """LiveCodeBench-style: per line after stripping trailing whitespace, empty lines ignored, and
    whitespace-separated tokens compared as exact decimals where both sides are numbers."""
    got_lines, want_lines = _lines(got), _lines(want)
    if len(got_lines) != len(want_lines):
        return False
    for g, w in zip(got_lines, want_lines, strict=True):
        if g != w:
            g_tokens, w_tokens = g.split(), w.split()
            if len(g_tokens) != len(w_tokens) or not all(map(_same_token, g_tokens, w_tokens)):
                return False
    return True


def parse_result(text: str) -> tuple[bool, Any]:
    """(ok, value) of a call result the sandbox returned as JSON text; anything unparsable is not ok."""
    if not text or len(text) > MAX_RESULT_CHARS:
        return False, None
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):  # also int strings over the digit limit
        return False, None


def same_value(got: Any, want: Any) -> bool:
    """Structural equality of plain JSON data; tuples arrive as lists, floats compare within 1e-9 relative."""
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, int | float) and isinstance(got, int | float):
        if isinstance(want, int) and isinstance(got, int):
            return got == want
        return math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-9)
    if isinstance(want, list) and isinstance(got, list):
        return len(got) == len(want) and all(map(same_value, got, want))
    if isinstance(want, dict) and isinstance(got, dict):
        return got.keys() == want.keys() and all(same_value(got[k], want[k]) for k in want)
    return type(got) is type(want) and got == want
