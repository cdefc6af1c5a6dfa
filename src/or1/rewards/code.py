"""Code reward: extract the program from a response, run its tests in a sandbox, and compare on the host.

Training, evaluation and `or1 score` call `score_code_batch` (through or1.rewards.score for mixed batches). The
program is the last ```python block after the last `</think>`; it must parse. A problem's tests run in one visit
to an isolated sandbox slot (or1.sandbox), one after another, each with its own limits; problems run in parallel
across slots; all comparison happens here, in the parent, as the replies stream in. Binary reward by default
(every test passes; the visit stops at the first failure), or the fraction of tests passed.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from or1.rewards.code_tests import (
    AssertCase,
    CallCase,
    Case,
    StdinCase,
    parse_ground_truth,
    parse_result,
    same_stdout,
    same_value,
)
from or1.rewards.result import (
    BAD_INPUT,
    CORRECT,
    INTERNAL_ERROR,
    NO_CODE,
    RUNTIME_ERROR,
    SYNTAX_ERROR,
    TIMEOUT,
    WRONG_OUTPUT,
    Result,
)
from or1.sandbox.pool import Sandbox, get_pool
from or1.sandbox.protocol import BatchRequest, Limits, TestReply, TestRequest

if TYPE_CHECKING:
    from or1.sandbox.pool import SandboxPool
    from or1.sandbox.probes import Probe

DEFAULT_TIMEOUT = 6.0  # seconds per test, as in Skywork-OR1
PROBLEM_BUDGET = 60.0  # seconds of test wall time per problem; a per-test timeout above it raises the budget
_BLOCK = re.compile(r"```python3?[ \t]*\n(.*?)```", re.DOTALL)
PROGRAM_FILE = "<or1-program>"  # the file name a model's program is parsed under
# Parsing a model's program here, in the scorer's process, must not print its compile warnings (an invalid escape
# is a SyntaxWarning, a DeprecationWarning before Python 3.12) on the console; a filter by file name, not a
# catch_warnings, because scoring runs on several threads.
warnings.filterwarnings("ignore", module=re.escape(PROGRAM_FILE))


def extract_program(response: str) -> str | None:
    """The last ```python block of the text after the last `</think>` (the whole text without the tag)."""
    answer = response.rsplit("</think>", 1)[-1]
    blocks = _BLOCK.findall(answer)
    return blocks[-1] if blocks else None


def _test(case: Case, timeout: float) -> TestRequest:
    """One test of a batch (the batch carries the program and the limits): what the sandbox may see of `case`,
    never its expected output."""
    if isinstance(case, StdinCase):
        return TestRequest("stdin", "", timeout, stdin=case.stdin)
    if isinstance(case, CallCase):
        return TestRequest("call", "", timeout, fn_name=case.fn_name, args=case.args)
    return TestRequest(
        "assert",
        "",
        timeout,
        prefix=case.prefix,
        test_code=case.test_code,
        entry_point=case.entry_point,
    )


def _clip(text: str, width: int = 80) -> str:
    """`text` for a one-line detail: repr'd, cut to `width` characters."""
    return repr(text[:width] + ("..." if len(text) > width else ""))


def judge(case: Case, reply: TestReply) -> tuple[str, str]:
    """(reason, detail) of one test from what the sandbox reported; reason CORRECT when it passed."""
    tail = reply.stderr.strip().splitlines()[-1][:200] if reply.stderr.strip() else ""
    if reply.status == "internal":
        return INTERNAL_ERROR, f"sandbox failure: {tail}"
    if reply.status == "timeout":
        return TIMEOUT, f"test ran past {reply.wall:.1f} s"
    if reply.status == "output_limit":
        return RUNTIME_ERROR, "output limit exceeded"
    if reply.status != "ok":
        wrong = isinstance(case, AssertCase) and "AssertionError" in reply.stderr
        return (WRONG_OUTPUT if wrong else RUNTIME_ERROR), tail or f"exit code {reply.exit_code}"
    if isinstance(case, StdinCase):
        if same_stdout(reply.stdout, case.stdout):
            return CORRECT, ""
        return WRONG_OUTPUT, f"stdout {_clip(reply.stdout)}, expected {_clip(case.stdout)}"
    if isinstance(case, CallCase):
        ok, value = parse_result(reply.result)
        if not ok:
            return RUNTIME_ERROR, "no JSON return value"
        if same_value(value, case.expected):
            return CORRECT, ""
        return WRONG_OUTPUT, f"returned {_clip(reply.result)}, expected {_clip(json.dumps(case.expected))}"
    return (CORRECT, "") if reply.result == "PASS" else (WRONG_OUTPUT, "check() did not return")


def score_program(
    program: str,
    cases: list[Case],
    sandbox: Sandbox,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    fraction: bool = False,
    limits: Limits | None = None,
) -> Result:
    """Run `cases` against `program` in one visit to a sandbox slot (one after another) and score them.

    Each test has `timeout`; all of them together `max(PROBLEM_BUDGET, timeout)`, past which the rest are not run.
    """
    budget = max(PROBLEM_BUDGET, timeout)
    batch = BatchRequest(program, [_test(case, timeout) for case in cases], budget, limits or Limits())
    replies = sandbox.run_batch(batch, lambda i, reply: fraction or judge(cases[i], reply)[0] == CORRECT)
    passed, first_failure = 0, None
    for index, (case, reply) in enumerate(zip(cases, replies, strict=False)):  # a stopped visit has fewer
        reason, detail = judge(case, reply)
        if reason == CORRECT:
            passed += 1
            continue
        first_failure = first_failure or (reason, f"test {index}: {detail}")
        if not fraction:
            break
    if len(replies) < len(cases) and (fraction or first_failure is None):
        first_failure = first_failure or (
            TIMEOUT,
            f"test {len(replies)}: problem budget of {budget:g} s used up",
        )
    if first_failure is None:
        return Result(1.0, CORRECT, program, f"{passed}/{len(cases)} tests passed")
    score = passed / len(cases) if fraction else 0.0
    return Result(score, first_failure[0], program, first_failure[1])


def prepare_problem(response: object, ground_truth: object) -> tuple[str, list[Case]] | Result:
    """(program, cases), or the Result that ends the problem before any test runs."""
    try:
        if not isinstance(ground_truth, str | bytes | Mapping):
            raise ValueError(
                f"ground truth must be a JSON string or a dict, got {type(ground_truth).__name__}"
            )
        cases = parse_ground_truth(ground_truth)
    except ValueError as exc:
        return Result(0.0, BAD_INPUT, None, str(exc))
    if not isinstance(response, str):
        return Result(0.0, BAD_INPUT, None, "response is not a string")
    program = extract_program(response)
    if program is None:
        return Result(0.0, NO_CODE, None, "no ```python block after </think>")
    try:
        ast.parse(program, filename=PROGRAM_FILE)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        return Result(0.0, SYNTAX_ERROR, program, f"{type(exc).__name__}: {exc}"[:200])
    return program, cases


def score_code_batch(
    responses: list[str],
    ground_truths: list,
    *,
    slots: int = 2,
    timeout: float | None = None,
    backend: str = "local",
    fraction: bool = False,
) -> list[Result]:
    """Score each response against its code ground truth; one Result per response, in order.

    `ground_truths` are JSON strings or dicts in the three forms of `or1.rewards.code_tests`; an invalid one scores
    0 (bad_input).
    `timeout` is per test (default 6 s); `slots` sandboxes of `backend` ("local" or "docker") run problems in
    parallel; `fraction` scores the fraction of tests passed instead of all-or-nothing.
    """
    if len(responses) != len(ground_truths):
        raise ValueError(f"{len(responses)} responses but {len(ground_truths)} ground truths")
    per_test = DEFAULT_TIMEOUT if timeout is None else float(timeout)
    if per_test <= 0:
        raise ValueError(f"timeout must be > 0, got {timeout}")
    prepared = [prepare_problem(r, g) for r, g in zip(responses, ground_truths, strict=True)]
    if all(isinstance(p, Result) for p in prepared):
        return [p for p in prepared if isinstance(p, Result)]  # nothing to run: no pool is started
    return _run_prepared(get_pool(backend, slots), prepared, [per_test] * len(prepared), fraction)


def score_on_pool(
    pool: SandboxPool,
    responses: Sequence[object],
    ground_truths: Sequence[object],
    timeouts: Sequence[float],
    *,
    fraction: bool = False,
) -> list[Result]:
    """Like `score_code_batch`, on a pool the caller opened, with a per-test timeout for each response."""
    prepared = [prepare_problem(r, g) for r, g in zip(responses, ground_truths, strict=True)]
    return _run_prepared(pool, prepared, list(timeouts), fraction)


def judge_probes(pool: SandboxPool, probes: Sequence[Probe]) -> list[Result]:
    """The code reward's verdict on each probe of `or1 sandbox check` (the sandbox runs them; the reward judges)."""
    return score_on_pool(
        pool, [p.response for p in probes], [p.ground_truth for p in probes], [p.timeout for p in probes]
    )


def _run_prepared(
    pool: SandboxPool,
    prepared: Sequence[tuple[str, list[Case]] | Result],
    timeouts: list[float],
    fraction: bool,
) -> list[Result]:
    """Run the prepared problems on `pool` (one slot each, in parallel); decided ones keep their Result."""
    results: list[Result | None] = [p if isinstance(p, Result) else None for p in prepared]
    todo = [(i, p) for i, p in enumerate(prepared) if not isinstance(p, Result)]

    def job(item: tuple[str, list[Case]], per_test: float):
        def visit(sandbox: Sandbox) -> Result:
            start = time.monotonic()
            result = score_program(item[0], item[1], sandbox, timeout=per_test, fraction=fraction)
            return dataclasses.replace(result, seconds=round(time.monotonic() - start, 6))

        return visit

    if todo:
        outcomes = pool.map([job(p, timeouts[i]) for i, p in todo])
        for (index, _), result in zip(todo, outcomes, strict=True):
            results[index] = result
    return [r if r is not None else Result(0.0, INTERNAL_ERROR, None, "not scored") for r in results]
