"""One batch API for every reward: `score_batch(rows)` -> one Result per row, in order.

Training (every step), evaluation and `or1 score` all call this. Rows are or1 rows with a `response`: `ability`
picks the reward. Math rows are decided in this process when string work suffices (`prejudge`), the rest go to a
persistent killable process pool (`or1.rewards.process_pool`) with a hard per-response timeout. Code rows go to
`or1.rewards.code.score_code_batch`. A malformed row scores 0 with reason `bad_input`; the batch carries on.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from or1.rewards.extract import EXTRACTION_MODES
from or1.rewards.math import prejudge, verify_math, warm_up
from or1.rewards.process_pool import OK, TIMEOUT, ProcessPool
from or1.rewards.result import BAD_INPUT, INTERNAL_ERROR, Result
from or1.rewards.result import TIMEOUT as TIMEOUT_REASON

if TYPE_CHECKING:
    from or1.config.schema import RewardConfig

_POOLS: dict[int, ProcessPool] = {}
_POOLS_LOCK = threading.Lock()


def math_pool(workers: int) -> ProcessPool:
    """The process-wide math verifier pool with `workers` processes, created on first use and then reused."""
    with _POOLS_LOCK:
        pool = _POOLS.get(workers)
        if pool is None:
            pool = ProcessPool(workers, warmup=warm_up, preload=("or1.rewards.math",))
            _POOLS[workers] = pool
        return pool


def close_pools() -> None:
    """Stop every math pool this process started (they also stop at interpreter exit)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()


def _row_fields(row: object) -> tuple[str, Any, Any] | Result:
    """(ability, response, ground_truth) of one row, or the bad_input Result that says what is wrong with it."""
    if not isinstance(row, Mapping):
        return Result(0.0, BAD_INPUT, detail="row is not a mapping")
    ability = row.get("ability")
    if ability not in ("math", "code"):
        return Result(0.0, BAD_INPUT, detail=f"ability must be 'math' or 'code', got {ability!r}")
    response = row.get("response")
    if not isinstance(response, str):
        return Result(0.0, BAD_INPUT, detail="response missing or not a string")
    reward_model = row.get("reward_model")
    if isinstance(reward_model, str):
        try:
            reward_model = json.loads(reward_model)
        except ValueError:
            return Result(0.0, BAD_INPUT, detail="reward_model is not valid JSON")
    if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
        return Result(0.0, BAD_INPUT, detail="reward_model.ground_truth missing")
    return ability, response, reward_model["ground_truth"]


def _score_math(
    jobs: list[tuple[int, str, Any]],
    results: list[Result | None],
    workers: int,
    timeout: float,
    extraction: str,
) -> None:
    """Fill `results` for math rows: prejudged here, the rest verified in the pool under `timeout`."""
    pending = []
    for index, response, ground_truth in jobs:
        decided = prejudge(response, ground_truth, extraction)
        if decided is not None:
            results[index] = decided
        else:
            pending.append((index, (response, ground_truth, extraction)))
    if not pending:
        return
    outcomes = math_pool(workers).map(verify_math, [args for _, args in pending], timeout=timeout)
    for (index, _), outcome in zip(pending, outcomes, strict=True):
        if outcome.status == OK:
            result = outcome.value
        elif outcome.status == TIMEOUT:
            result = Result(0.0, TIMEOUT_REASON, detail=f"math verification exceeded {timeout:g} s")
        else:
            result = Result(0.0, INTERNAL_ERROR, detail=outcome.error)
        results[index] = dataclasses.replace(result, seconds=round(outcome.seconds, 6))


def _score_code(
    jobs: list[tuple[int, str, Any]], results: list[Result | None], workers: int, timeout: float | None
) -> None:
    """Fill `results` for code rows through the code reward, imported only when a batch has code rows."""
    try:
        from or1.rewards.code import score_code_batch
    except ImportError:
        for index, _, _ in jobs:
            results[index] = Result(0.0, INTERNAL_ERROR, detail="code reward unavailable")
        return
    scored = score_code_batch(
        [r for _, r, _ in jobs], [g for _, _, g in jobs], slots=workers, timeout=timeout
    )
    for (index, _, _), result in zip(jobs, scored, strict=True):
        results[index] = result


def score_batch(
    rows: Sequence[Mapping[str, Any]],
    *,
    workers: int = 2,
    timeout: float = 5.0,
    code_timeout: float | None = None,
    math_extraction: str = "math_verify",
) -> list[Result]:
    """Score each row (`ability`, `response`, `reward_model.ground_truth`); ordered, one Result per row.

    `workers`: verifier processes for math, sandbox slots for code. `timeout`: hard limit in seconds for one math
    verification. `code_timeout`: per-test limit for code rows (None: the code reward's default, 6 s as in
    Skywork-OR1). `math_extraction`: where a math answer is looked for (reward.math_extraction; math_verify, the
    default as in Skywork-OR1, statement or boxed: see `or1.rewards.extract`). Safe to call from any thread, threaded or async Ray actors (from an executor thread) and
    subprocesses; scripts that call it need the usual `if __name__ == "__main__":` guard (spawned workers
    re-import the main module).
    """
    if workers < 1 or timeout <= 0:
        raise ValueError(f"workers must be >= 1 and timeout > 0, got workers={workers} timeout={timeout}")
    if math_extraction not in EXTRACTION_MODES:
        raise ValueError(f"math_extraction must be one of {EXTRACTION_MODES}, got {math_extraction!r}")
    results: list[Result | None] = [None] * len(rows)
    math_jobs: list[tuple[int, str, Any]] = []
    code_jobs: list[tuple[int, str, Any]] = []
    for index, row in enumerate(rows):
        fields = _row_fields(row)
        if isinstance(fields, Result):
            results[index] = fields
            continue
        ability, response, ground_truth = fields
        (math_jobs if ability == "math" else code_jobs).append((index, response, ground_truth))
    if math_jobs:
        _score_math(math_jobs, results, workers, timeout, math_extraction)
    if code_jobs:
        _score_code(code_jobs, results, workers, code_timeout)
    return [r if r is not None else Result(0.0, INTERNAL_ERROR, detail="row not scored") for r in results]


def score_with(rows: Sequence[Mapping[str, Any]], config: RewardConfig) -> list[Result]:
    """`score_batch` under a recipe's reward settings (verifier processes, both timeouts, math extraction): what
    training scores with, on the head or in a node's scorer."""
    return score_batch(
        rows,
        workers=config.workers,
        timeout=config.math_timeout,
        code_timeout=config.code_timeout,
        math_extraction=config.math_extraction,
    )
