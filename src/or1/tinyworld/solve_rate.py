"""How often a model solves tiny-world rows: several samples per problem, overall and per difficulty.

Difficulty is a row's operand count (math, extra_info.num_ops) or step count (code, extra_info.num_steps).
init_tiny_model reports it for the base model on both validation splits; it is the tiny world's quick check that a
model sits at the frontier.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from or1.data.synthetic import code_validation_rows, math_validation_rows
from or1.engines.loading import load_rollout_engine
from or1.engines.rollout import EngineSettings, RolloutEngine, SamplingParams
from or1.rewards.code import score_code_batch
from or1.rewards.math import verify_math
from or1.tokens import load_tokenizer, prompt_ids


@dataclass(frozen=True)
class SolveRate:
    """Fraction of correct samples, overall and by difficulty (operands or steps)."""

    overall: float
    by_difficulty: dict[int, float]
    problems: int
    samples_per_problem: int
    truncated: float  # fraction of samples cut at max_response_length
    seconds: float = 0.0


def _correct(texts: list[str], rows: list[dict[str, Any]], samples: int) -> list[bool]:
    """Each sample judged by its row's verifier: programs run in the local sandbox, math in this process (tiny
    answers are short integers that verify_math settles on its string fast path)."""
    truths = [rows[i // samples]["reward_model"]["ground_truth"] for i in range(len(texts))]
    code = [i for i in range(len(texts)) if rows[i // samples]["ability"] == "code"]
    passed = score_code_batch([texts[i] for i in code], [truths[i] for i in code]) if code else []
    correct = {i: r.correct for i, r in zip(code, passed, strict=True)}
    return [correct[i] if i in correct else verify_math(t, truths[i]).correct for i, t in enumerate(texts)]


def difficulty(row: dict[str, Any]) -> int:
    """A tiny row's operand count (math) or step count (code); 0 for other rows."""
    extra = row.get("extra_info") or {}
    return int(extra.get("num_ops") or extra.get("num_steps") or 0)


def measure_solve_rate(
    engine: RolloutEngine,
    tokenizer: PreTrainedTokenizerBase,
    rows: list[dict[str, Any]],
    *,
    samples: int = 5,
    temperature: float = 1.0,
    max_response_length: int = 96,
    seed: int = 0,
) -> SolveRate:
    """Sample `samples` responses per row and score each against the row's ground truth."""
    start = time.perf_counter()
    prompts = [prompt_ids(tokenizer, list(row["prompt"])) for row in rows]
    sampling = SamplingParams(
        n=samples, temperature=temperature, max_response_length=max_response_length, seed=seed
    )
    out = engine.generate_ids(prompts, sampling)
    texts = tokenizer.batch_decode(out.responses, skip_special_tokens=True)
    hits: dict[int, list[bool]] = defaultdict(list)
    for i, correct in enumerate(_correct(texts, rows, samples)):
        hits[difficulty(rows[i // samples])].append(correct)
    flat = [h for group in hits.values() for h in group]
    return SolveRate(
        overall=sum(flat) / len(flat),
        by_difficulty={k: sum(v) / len(v) for k, v in sorted(hits.items())},
        problems=len(rows),
        samples_per_problem=samples,
        truncated=sum(out.truncated) / len(out.truncated),
        seconds=time.perf_counter() - start,
    )


def validation_solve_rate(
    model_dir: str | Path,
    *,
    samples: int = 5,
    temperature: float = 1.0,
    max_response_length: int = 96,
    seed: int = 1234,
    engine: str = "hf",
    ability: str = "math",
) -> SolveRate:
    """The solve rate of a saved model on one of the tiny world's fixed validation splits (`ability`: math, the
    200 arithmetic problems, or code, the 100 programs; `engine`: hf, vllm)."""
    return measure_solve_rate(
        load_rollout_engine(engine, model_dir, EngineSettings(micro_batch_size=128)),
        load_tokenizer(model_dir),
        math_validation_rows() if ability == "math" else code_validation_rows(),
        samples=samples,
        temperature=temperature,
        max_response_length=max_response_length,
        seed=seed,
    )
