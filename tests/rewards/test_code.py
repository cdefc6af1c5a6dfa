"""Code reward on the host side: extraction, the three ground-truth forms, and output comparison."""

from __future__ import annotations

import json

import pytest

from or1.rewards.code import extract_program, prepare_problem, score_code_batch
from or1.rewards.code_tests import (
    AssertCase,
    CallCase,
    StdinCase,
    parse_ground_truth,
    parse_result,
    same_stdout,
    same_value,
)
from or1.rewards.result import BAD_INPUT, NO_CODE, SYNTAX_ERROR


def test_extracts_last_python_block_after_think():
    response = (
        "```python\nprint(0)\n```</think>draft\n```python\nprint(1)\n```\nfinal\n```python\nprint(2)\n```"
    )
    assert extract_program(response) == "print(2)\n"
    assert extract_program("<think>```python\nprint(1)\n```</think> no code") is None
    assert extract_program("```py\nprint(1)\n```") is None
    assert extract_program("no think tag\n```python3\nx = 1\n```") == "x = 1\n"


def test_no_code_and_syntax_errors_score_zero_without_a_sandbox():
    gt = {"inputs": ["1\n"], "outputs": ["1\n"]}
    assert prepare_problem("just words", gt).reason == NO_CODE
    bad = prepare_problem("```python\ndef f(:\n```", gt)
    assert bad.reason == SYNTAX_ERROR and bad.score == 0.0
    nested = prepare_problem("```python\n" + "(" * 100_000 + "\n```", gt)
    assert nested.reason == SYNTAX_ERROR


def test_a_program_s_compile_warnings_stay_out_of_the_console():
    """Parsing a model's program in the scorer's process printed its compile warnings (here an invalid escape
    sequence: a SyntaxWarning, before Python 3.12 a DeprecationWarning) on the training console, even with every
    warning shown (-W always); the program still parses and is run."""
    import subprocess
    import sys

    program = "```python\nimport re\nprint(re.findall('\\d+', input()) == [])\n```"
    code = (
        "from or1.rewards.code import prepare_problem; "
        f"p = prepare_problem({program!r}, {{'inputs': ['1'], 'outputs': ['False']}}); print(type(p).__name__)"
    )
    done = subprocess.run([sys.executable, "-W", "always", "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == "tuple" and "Warning" not in done.stderr, done.stderr


def test_three_forms_are_recognised():
    stdin = parse_ground_truth(json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}))
    assert stdin == [StdinCase("1 2\n", "3\n")]
    lcb = parse_ground_truth({"inputs": ['"abacb"\n2'], "outputs": ["4"], "fn_name": "numberOfSubstrings"})
    assert lcb == [CallCase("numberOfSubstrings", ["abacb", 2], 4)]
    taco = parse_ground_truth({"inputs": [[[1, 2], 3]], "outputs": [[[4, 5]]], "fn_name": "f"})
    assert taco == [CallCase("f", [[1, 2], 3], [4, 5])]
    asserts = parse_ground_truth(
        {"import_prefix": "import math", "test_code": "def check(c): pass", "entry_point": "Solution().f"}
    )
    assert asserts == [AssertCase("import math", "def check(c): pass", "Solution().f")]


def test_none_keys_from_datasets_map_are_dropped():
    """Hugging Face `datasets.map` fills the other forms' keys with None; they must not pick the form."""
    row = {
        "inputs": ["1\n"],
        "outputs": ["1\n"],
        "fn_name": None,
        "import_prefix": None,
        "test_code": None,
        "entry_point": None,
    }
    assert parse_ground_truth(row) == [StdinCase("1\n", "1\n")]
    assert isinstance(
        parse_ground_truth(
            {
                "inputs": None,
                "outputs": None,
                "test_code": "def check(c): pass",
                "entry_point": "f",
                "fn_name": None,
            }
        )[0],
        AssertCase,
    )


@pytest.mark.parametrize(
    "gt",
    [
        "not json",
        "[1, 2]",
        {"inputs": ["1"]},
        {"inputs": ["1"], "outputs": []},
        {"inputs": [], "outputs": []},
        {"inputs": [1], "outputs": ["1"]},
        {"inputs": ["1"], "outputs": ["1"], "fn_name": "not a name"},
        {"inputs": ["{bad"], "outputs": ["1"], "fn_name": "f"},
        {"test_code": "def check(c): pass"},
        42,
        None,
    ],
)
def test_invalid_ground_truth_is_bad_input(gt):
    result = score_code_batch(["```python\nprint(1)\n```"], [gt])[0]
    assert result.score == 0.0 and result.reason == BAD_INPUT


@pytest.mark.parametrize(
    "got, want, same",
    [
        ("3\n", "3", True),
        ("3   \n\n\n", "3\n", True),
        ("1 2\n3\n", "1 2\n3", True),
        ("1.0 2\n", "1 2\n", True),
        ("1e3\n", "1000\n", True),
        ("3\n", "4\n", False),
        ("1 2\n", "1  2\n", True),
        ("\n3\n", "3\n", True),  # empty lines are ignored (TACO outputs carry stray ones)
        ("1\n2\n", "1\n\n2\n", True),
        ("abc\n", "ABC\n", False),
        ("1 2\n", "1 2 3\n", False),
        ("", "0\n", False),
        ("", "\n", True),
        ("0.1000001\n", "0.1\n", False),
        ("nan\n", "nan\n", True),
        ("nan\n", "NaN\n", False),
        ("3\n4\n", "3\n", False),
    ],
)
def test_stdout_comparison_is_livecodebench_like(got: str, want: str, same: bool):
    assert same_stdout(got, want) is same


@pytest.mark.parametrize(
    "got, want, same",
    [
        (3, 3, True),
        (3.0, 3, True),
        (True, 1, False),
        (1, True, False),
        ([1, [2]], [1, [2]], True),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1.0}, True),
        ("a", "a", True),
        (0.1 + 0.2, 0.3, True),
        (None, None, True),
        (None, 0, False),
        ([1], 1, False),
    ],
)
def test_return_value_comparison(got, want, same: bool):
    assert same_value(got, want) is same


def test_results_are_parsed_only_when_plain_json():
    assert parse_result("[1, 2]") == (True, [1, 2])
    assert parse_result("")[0] is False and parse_result("[1,")[0] is False
    assert parse_result("9" * 10_000)[0] is False  # over Python's int digit limit
    assert parse_result("[" * 100_000 + "]" * 100_000)[0] is False
