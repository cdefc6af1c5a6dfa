"""Turn each known benchmark record schema into an or1 row (the schemas: the docstrings of the functions below).

Math records (`problem` + `answer`, in the Qwen2.5-Math, AReaL, MATH-500, AMC and hub AIME spellings) become math
rows whose ground truth is a JSON list of answers. LiveCodeBench records, either the public-test file of a benchmark
folder (OR1_BENCHMARKS) or the hub's `livecodebench/code_generation_lite` rows, become code rows with stdin/stdout
or call-based tests. Rows already in or1 form pass through unchanged.
"""

from __future__ import annotations

import base64
import io
import json
import pickle
import re
import zlib
from datetime import date, datetime
from typing import Any

from or1.data.rows import make_row, validate_row
from or1.errors import UserError

MATH_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
MAX_DECODED_BYTES = 512 * 1024 * 1024  # a private-test blob larger than this is not a test suite

CODE_STDIN_INSTRUCTIONS = (
    "Write a Python 3 program that reads the input from standard input and writes the answer to standard output. "
    "Give the complete program in one ```python code block at the end of your answer."
)
CODE_CALL_INSTRUCTIONS = (
    "Complete the following starter code in Python 3; your method is called directly with the test arguments. "
    "Give the complete class in one ```python code block at the end of your answer.\n\n```python\n{starter}\n```"
)
_METHOD = re.compile(r"^\s*def\s+([A-Za-z_]\w*)\s*\(\s*self\b", re.MULTILINE)


def is_or1_row(record: dict[str, Any]) -> bool:
    return isinstance(record.get("prompt"), list) and isinstance(record.get("reward_model"), dict)


def math_answer(value: Any) -> str:
    """The gold answer as text: floats that are whole numbers ("142.0" in the AMC files) become integers."""
    if isinstance(value, bool) or value is None:
        raise UserError(f"math answer must be a number or text, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def math_row(record: dict[str, Any], *, data_source: str, index: int) -> dict[str, Any]:
    """An or1 math row from a `problem`/`question` + `answer` record of any of the math schemas."""
    problem = record.get("problem", record.get("question"))
    if not isinstance(problem, str) or "answer" not in record:
        raise UserError(f"record {index} has no 'problem' text and 'answer'; keys are {sorted(record)}")
    extra = {"index": index, "split": "test"}
    for key in ("id", "unique_id", "url", "subject", "level", "year"):
        if record.get(key) is not None:
            extra[key] = record[key]
    return make_row(
        data_source=data_source,
        prompt=[{"role": "user", "content": f"{problem.strip()} {MATH_SUFFIX}"}],
        ability="math",
        ground_truth=[math_answer(record["answer"])],
        extra_info=extra,
    )


def method_name(starter_code: str) -> str | None:
    """The method a LeetCode-style starter class asks for: the last `def name(self, ...)` in it."""
    names = _METHOD.findall(starter_code or "")
    return names[-1] if names else None


def code_truth(tests: list[dict[str, Any]], fn_name: str | None) -> dict[str, Any]:
    """Code ground truth from LiveCodeBench tests [{input, output, testtype}] (stdin/stdout or call-based)."""
    if not tests:
        raise UserError("a LiveCodeBench problem has no tests")
    kinds = {t.get("testtype") for t in tests}
    if not kinds <= {"stdin", "functional"} or len(kinds) != 1:
        raise UserError(
            f"LiveCodeBench tests must all be 'stdin' or all 'functional', got {sorted(map(str, kinds))}"
        )
    truth: dict[str, Any] = {"inputs": [t["input"] for t in tests], "outputs": [t["output"] for t in tests]}
    if kinds == {"functional"}:
        if not fn_name:
            raise UserError("a functional LiveCodeBench problem has no method name in its starter code")
        truth["fn_name"] = fn_name
    return truth


def code_prompt(problem: str, starter_code: str) -> str:
    if starter_code and starter_code.strip():
        return f"{problem.strip()}\n\n{CODE_CALL_INSTRUCTIONS.format(starter=starter_code.rstrip())}"
    return f"{problem.strip()}\n\n{CODE_STDIN_INSTRUCTIONS}"


def lcb_row(record: dict[str, Any], *, data_source: str, index: int) -> dict[str, Any]:
    """An or1 code row from a LiveCodeBench record: the shared public-test file or a hub row."""
    if "question_content" in record:  # hub schema
        problem, starter = record["question_content"], record.get("starter_code") or ""
        tests = _json_tests(record.get("public_test_cases")) + decode_private_tests(
            record.get("private_test_cases")
        )
        metadata = _json_object(record.get("metadata"))
        fn_name = metadata.get("func_name") or method_name(starter)
    else:
        problem, starter, tests = record.get("problem"), record.get("starter_code") or "", record.get("tests")
        if not isinstance(problem, str) or not isinstance(tests, list):
            raise UserError(f"record {index} is not a LiveCodeBench problem; keys are {sorted(record)}")
        fn_name = method_name(starter)
    extra: dict[str, Any] = {"index": index, "split": "test"}
    for key in ("question_id", "question_title", "platform", "difficulty", "contest_date"):
        if record.get(key) is not None:
            extra[key] = str(record[key])
    return make_row(
        data_source=data_source,
        prompt=[{"role": "user", "content": code_prompt(problem, starter)}],
        ability="code",
        ground_truth=code_truth(tests, fn_name),
        extra_info=extra,
    )


def to_or1_row(record: dict[str, Any], *, ability: str, data_source: str, index: int) -> dict[str, Any]:
    """Any known record as an or1 row; `ability` picks the converter for records not already in or1 form."""
    if not isinstance(record, dict):
        raise UserError(f"record {index} is a {type(record).__name__}, not an object")
    if is_or1_row(record):
        validate_row(record, where=f"record {index}")
        return record
    if ability == "code":
        return lcb_row(record, data_source=data_source, index=index)
    return math_row(record, data_source=data_source, index=index)


def record_date(record: dict[str, Any]) -> date | None:
    """The contest date of a record (hub LiveCodeBench has `contest_date`), or None when it has none."""
    value = record.get("contest_date")
    if value is None and isinstance(record.get("extra_info"), dict):
        value = record["extra_info"].get("contest_date")
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).date()
    except ValueError:
        raise UserError(f"contest_date {value!r} is not an ISO date") from None


class _StrOnlyUnpickler(pickle.Unpickler):
    """Refuses every global: a pickled str needs none, and anything that does is not test data."""

    def find_class(self, module: str, name: str) -> Any:
        raise UserError(f"private tests reference {module}.{name}; only a pickled string is accepted")


def decode_private_tests(blob: Any) -> list[dict[str, Any]]:
    """LiveCodeBench private tests: a JSON string, or base64 -> zlib -> pickle of a JSON string (str only)."""
    try:
        return _json_tests(blob)  # also None, "" (no tests) and a list as is
    except UserError:
        pass  # not plain JSON: the compressed form
    try:
        packed = zlib.decompressobj().decompress(base64.b64decode(blob), MAX_DECODED_BYTES)
        text = _StrOnlyUnpickler(io.BytesIO(packed)).load()
    except (ValueError, zlib.error, pickle.UnpicklingError, EOFError) as err:
        raise UserError(f"private tests are neither JSON nor base64/zlib/pickle: {err}") from None
    if not isinstance(text, str):
        raise UserError(f"private tests unpickled to a {type(text).__name__}, expected a JSON string")
    return _json_tests(text)


def _json_tests(value: Any) -> list[dict[str, Any]]:
    """Test cases from a JSON list string; a list as is, None or "" as none."""
    if value is None or value == "":
        return []
    if isinstance(value, list):
        return value
    try:
        tests = json.loads(value)
    except (TypeError, ValueError):
        raise UserError("test cases are not a JSON list") from None
    if not isinstance(tests, list):
        raise UserError("test cases are not a JSON list")
    return tests


def _json_object(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    try:
        decoded = json.loads(value) if value else {}
    except (TypeError, ValueError):
        return {}
    return decoded if isinstance(decoded, dict) else {}
