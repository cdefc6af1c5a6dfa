"""How often a model solves math rows: several samples per problem, overall and per operand count.

init_tiny_model reports it for the base model; it is the tiny world's quick check that a model sits at the frontier.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from or1.data.synthetic import math_validation_rows
from or1.engines.loading import load_rollout_engine
from or1.engines.rollout import RolloutEngine, SamplingParams
from or1.rewards.math import verify_math
from or1.tokens import load_tokenizer, prompt_ids


@dataclass(frozen=True)
class SolveRate:
    """Fraction of correct samples, overall and by extra_info.num_ops."""

    overall: float
    by_num_ops: dict[int, float]
    problems: int
    samples_per_problem: int
    truncated: float  # fraction of samples cut at max_response_length
    seconds: float = 0.0


def _is_correct(response: str, ground_truth: str) -> bool:
    # In-process: tiny-model answers are short integers that verify_math settles on its string fast path.
    return verify_math(response, ground_truth).correct


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
    """Sample `samples` responses per math row and score each against the row's ground truth."""
    start = time.perf_counter()
    prompts = [prompt_ids(tokenizer, list(row["prompt"])) for row in rows]
    sampling = SamplingParams(
        n=samples, temperature=temperature, max_response_length=max_response_length, seed=seed
    )
    out = engine.generate_ids(prompts, sampling)
    texts = tokenizer.batch_decode(out.responses, skip_special_tokens=True)
    hits: dict[int, list[bool]] = defaultdict(list)
    for i, text in enumerate(texts):
        row = rows[i // samples]
        num_ops = int((row.get("extra_info") or {}).get("num_ops", 0))
        hits[num_ops].append(_is_correct(text, row["reward_model"]["ground_truth"]))
    flat = [h for group in hits.values() for h in group]
    return SolveRate(
        overall=sum(flat) / len(flat),
        by_num_ops={k: sum(v) / len(v) for k, v in sorted(hits.items())},
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
) -> SolveRate:
    """The solve rate of a saved model on the tiny world's fixed 200-problem validation split (`engine`: hf, vllm)."""
    return measure_solve_rate(
        load_rollout_engine(engine, model_dir, micro_batch_size=128),
        load_tokenizer(model_dir),
        math_validation_rows(),
        samples=samples,
        temperature=temperature,
        max_response_length=max_response_length,
        seed=seed,
    )
