"""Adapters: one function per known dataset schema, each turning one raw record into an or1 row.

An adapter raises `Malformed` when a record cannot become a row (a missing field, undecodable tests); the pipeline
counts and traces that record instead of crashing. Adapters only translate: whether a row is worth training on
(proofs, multiple choice, missing tests) is the verifiability filters' call, so adapters keep the hints those filters
need in extra_info (question_type, solution, reference_solution, has_figure).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from or1.data.converters import (
    MATH_SUFFIX,
    code_prompt,
    decode_private_tests,
    lcb_row,
    math_answer,
    method_name,
    to_or1_row,
)
from or1.data.rows import make_row, validate_row
from or1.errors import UserError


class Malformed(ValueError):
    """A record that cannot become an or1 row; the message says why."""


@dataclass(frozen=True)
class Context:
    """What an adapter knows besides the record: the row's data_source, its split and its position in the source."""

    data_source: str
    split: str
    index: int
    ability: str | None = None  # for the benchmark adapter: which converter applies


Adapter = Callable[[dict[str, Any], Context], dict[str, Any]]


def _text(record: Mapping[str, Any], *keys: str) -> str:
    for key in keys:
        value = record.get(key)
        if isinstance(value, str) and value.strip():
            return value.strip()
    raise Malformed(f"no {' or '.join(repr(k) for k in keys)} text; keys are {sorted(record)}")


def _extra(ctx: Context, record: Mapping[str, Any], keys: tuple[str, ...], **more: Any) -> dict[str, Any]:
    extra = {"index": ctx.index, "split": ctx.split}
    extra.update({k: record[k] for k in keys if record.get(k) is not None})
    extra.update({k: v for k, v in more.items() if v is not None})
    return extra


def _math(record: Mapping[str, Any], ctx: Context, problem: str, keys: tuple[str, ...]) -> dict[str, Any]:
    answer = record.get("answer")
    given = (
        answer if isinstance(answer, list) else [answer]
    )  # a list: the acceptable answers, as or1 rows hold
    try:
        golds = [g for g in (math_answer(a) for a in given if a is not None) if g]
    except UserError as err:
        raise Malformed(str(err)) from None
    return make_row(
        data_source=ctx.data_source,
        prompt=[{"role": "user", "content": f"{problem} {MATH_SUFFIX}"}],
        ability="math",
        ground_truth=golds,  # an empty list is the no_answer filter's to drop
        extra_info=_extra(ctx, record, keys),
    )


def deepscaler(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """agentica-org/DeepScaleR-Preview-Dataset: problem, answer, solution."""
    return _math(record, ctx, _text(record, "problem"), ("solution",))


def numina(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """AI-MO/NuminaMath-1.5: problem, solution, answer, source, problem_type, question_type (proof, MCQ, ...)."""
    keys = ("solution", "source", "problem_type", "question_type", "synthetic")
    return _math(record, ctx, _text(record, "problem"), keys)


def still_omni(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """RUC-AIBOX/STILL-3-Preview-RL-Data (question, answer) and KbsdJames/Omni-MATH (problem, solution, answer, ...)."""
    keys = ("solution", "source", "domain", "difficulty")
    return _math(record, ctx, _text(record, "problem", "question"), keys)


def or1(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """Rows already in or1 form (Skywork/Skywork-OR1-RL-Data): None-valued keys that `datasets` pads in are dropped."""
    row = dict(record)
    reward = row.get("reward_model")
    if (
        isinstance(reward, dict)
        and isinstance(reward.get("ground_truth"), str)
        and row.get("ability") == "code"
    ):
        truth = _json(reward["ground_truth"], "code ground_truth")
        if isinstance(truth, dict):
            truth = {k: v for k, v in truth.items() if v is not None}
            row["reward_model"] = {**reward, "ground_truth": json.dumps(truth)}
    extra = row.get("extra_info")
    if isinstance(extra, dict):
        difficulty = extra.get("model_difficulty")
        if isinstance(difficulty, dict):  # parquet struct columns pad every model name in: drop the Nones
            extra = {**extra, "model_difficulty": {k: v for k, v in difficulty.items() if v is not None}}
        row["extra_info"] = extra
    try:
        validate_row(row, where=f"record {ctx.index}")
    except UserError as err:
        raise Malformed(str(err)) from None
    return row


def taco(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """BAAI/TACO: question, solutions (JSON list), starter_code, input_output (JSON: inputs, outputs, fn_name)."""
    problem = _text(record, "question")
    tests = _json(record.get("input_output") or "{}", "input_output")
    if not isinstance(tests, dict):
        raise Malformed("input_output is not a JSON object")
    truth = {"inputs": tests.get("inputs") or [], "outputs": tests.get("outputs") or []}
    if tests.get("fn_name"):
        truth["fn_name"] = tests["fn_name"]
    solutions = _json(record.get("solutions") or "[]", "solutions")
    reference = solutions[0] if isinstance(solutions, list) and solutions else None
    extra = _extra(
        ctx,
        record,
        ("difficulty", "source", "url", "name"),
        reference_solution=reference,
        has_figure=_figures(record.get("picture_num")) > 0 or None,
    )
    return _code_row(ctx, code_prompt(problem, record.get("starter_code") or ""), truth, extra)


def _figures(value: Any) -> int:
    """TACO's picture_num: the hub stores it as text ("0" is no figure); None or unreadable counts as none."""
    try:
        return int(str(value).strip() or 0) if value is not None else 0
    except ValueError:
        return 0


def livecodebench(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """livecodebench/code_generation_lite rows (private tests: base64 -> zlib -> pickle of plain data)."""
    try:
        row = lcb_row(record, data_source=ctx.data_source, index=ctx.index)
    except UserError as err:
        raise Malformed(str(err)) from None
    row["extra_info"]["split"] = ctx.split
    return row


def leetcode(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """newfacade/LeetCodeDataset: problem_description, starter_code, prompt (imports), test (check), entry_point."""
    problem = _text(record, "problem_description", "question")
    test_code = record.get("test") or ""
    truth = {
        "import_prefix": record.get("prompt") or "",
        "test_code": test_code,
        "entry_point": record.get("entry_point") or "",
    }
    if test_code and not truth["entry_point"]:
        truth["entry_point"] = f"Solution().{method_name(record.get('starter_code') or '') or 'solve'}"
    extra = _extra(
        ctx, record, ("task_id", "question_id", "difficulty"), reference_solution=record.get("completion")
    )
    if not test_code:  # keep the row for the no_tests filter to drop, with an empty stdin form
        truth = {"inputs": [], "outputs": []}
    return _code_row(ctx, code_prompt(problem, record.get("starter_code") or ""), truth, extra)


def benchmark(record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The evaluation files (AIME, MATH-500, AMC, LiveCodeBench public tests) as the evaluator reads them."""
    try:
        row = to_or1_row(record, ability=ctx.ability or "math", data_source=ctx.data_source, index=ctx.index)
    except UserError as err:
        raise Malformed(str(err)) from None
    return {**row, "extra_info": {**(row.get("extra_info") or {}), "split": ctx.split}}


def _code_row(ctx: Context, prompt: str, truth: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    try:
        return make_row(
            data_source=ctx.data_source,
            prompt=[{"role": "user", "content": prompt}],
            ability="code",
            ground_truth=truth,
            extra_info=extra,
        )
    except UserError as err:
        raise Malformed(str(err)) from None


def _json(value: Any, what: str) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as err:
        raise Malformed(f"{what} is not valid JSON ({err})") from None


ADAPTERS: dict[str, Adapter] = {
    "or1": or1,
    "skywork": or1,
    "deepscaler": deepscaler,
    "numina": numina,
    "still": still_omni,
    "omni-math": still_omni,
    "taco": taco,
    "livecodebench": livecodebench,
    "leetcode": leetcode,
    "benchmark": benchmark,
}


def detect(record: Mapping[str, Any]) -> str:
    """The adapter name for a record, from its keys (used when a source says `adapter: auto`)."""
    keys = set(record)
    if {"prompt", "reward_model"} <= keys:
        return "or1"
    if "question_content" in keys:
        return "livecodebench"
    if {"input_output", "question"} <= keys:
        return "taco"
    if {"problem_description", "entry_point"} <= keys:
        return "leetcode"
    if "question_type" in keys or "problem_type" in keys:
        return "numina"
    if "tests" in keys and "problem" in keys:
        return "benchmark"
    if "problem" in keys or "question" in keys:
        return "still"
    raise Malformed(f"no adapter recognises the keys {sorted(keys)}; name one in the spec")


def adapt(name: str, record: dict[str, Any], ctx: Context) -> dict[str, Any]:
    """The or1 row of `record` by the named adapter (`auto`: by its keys); Malformed when it cannot be one."""
    adapter = ADAPTERS[detect(record) if name == "auto" else name]
    try:
        return adapter(record, ctx)
    except Malformed:
        raise
    except (TypeError, KeyError, AttributeError, ValueError) as err:  # a field of an unexpected type
        raise Malformed(f"{type(err).__name__}: {err}") from None


__all__ = ["ADAPTERS", "Context", "Malformed", "adapt", "decode_private_tests", "detect"]
