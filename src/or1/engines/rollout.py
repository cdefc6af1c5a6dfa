"""The rollout interface: sample responses from token ids with any engine (Hugging Face loop or vLLM).

Training (each rank's colocated rollout), validation, `or1 eval`, the tiny solve-rate check and data difficulty
estimation all sample through `RolloutEngine.generate_ids`; `rollout.engine` (or `--engine`) picks the engine, in
`or1.engines.loading.load_rollout_engine` (this module imports no engine).
Conventions every engine keeps, so callers never branch on the engine:
- responses are token ids; a stop token that ended a response is its last token;
- `truncated` is True exactly when a response hit its budget without a stop token: `max_response_length`, or its
  row's own budget (`row_budgets`: partial rollout continues responses a bounded number of tokens per call);
- `log_probs` are the sampled tokens' log-probabilities under the sampling distribution (temperature and top_p
  applied), the same quantity the actor recomputes for PPO's ratio;
- a seeded call is reproducible: the same prompts, settings and seed give the same tokens; with `row_seeds` a
  row's tokens depend on its prompt and its own seed only (up to the kernels' batch-size numerics on a GPU);
- `stream_ids` yields rows as they finish (the trainer scores them while the rest still decode); `generate_ids` is
  the same sampling gathered into prompt-major order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from or1.errors import UserError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class EngineSettings:
    """How a rollout engine is built, from the recipe's rollout section or a command's flags. `dtype` and `seed`
    apply to both engines, `micro_batch_size` to the Hugging Face loop, the rest to vLLM."""

    dtype: str | None = None  # None: float32 on CPU, bfloat16 on a GPU (`dtype_on`)
    seed: int = 0
    micro_batch_size: int = 64  # sequences per generate call of the HF loop
    max_model_len: int | None = (
        None  # prompt + response tokens vLLM plans its KV cache for (None: the model's)
    )
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6  # vLLM's share of a GPU (weights + KV cache)
    cpu_kv_cache_gib: float = 1.0  # vLLM's KV cache on CPU
    enforce_eager: bool = False  # vLLM on a GPU: no CUDA graphs (the CPU always runs eager)
    distributed: bool = (
        False  # training: every rank builds its engine in the same call, joining torch's world
    )

    def dtype_on(self, gpu: bool) -> str:
        return self.dtype or ("bfloat16" if gpu else "float32")


@dataclass
class SamplingParams:
    """How to sample: `temperature` 0 means greedy; an empty `stop_token_ids` means the model's eos token(s)."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_length: int = 256
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None  # None: unseeded (not reproducible)
    # one seed per row (prompt-major), in place of `seed`: each row then samples from its own seed alone, so its
    # tokens do not depend on the call's other rows (evaluation: the same samples whatever the batching)
    row_seeds: list[int] | None = None
    # one token budget per row (prompt-major), each at most max_response_length, in place of it for that row
    row_budgets: list[int] | None = None

    def budget(self, row: int) -> int:
        """The most tokens row `row` (prompt-major) may sample in this call."""
        return self.max_response_length if self.row_budgets is None else self.row_budgets[row]

    def check(self) -> None:
        if self.n < 1 or self.max_response_length < 1:
            raise UserError(
                "n and max_response_length must be at least 1, got "
                f"n={self.n}, max_response_length={self.max_response_length}."
            )
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise UserError(
                f"temperature must be >= 0 and top_p in (0, 1], got {self.temperature} and {self.top_p}."
            )


@dataclass
class Generations:
    """Sampled token ids, prompt-major: the n samples of prompt i are rows i*n .. i*n+n-1."""

    responses: list[list[int]]  # the stop token is included when one was hit
    truncated: list[bool]  # True when max_response_length was reached without a stop token
    log_probs: list[list[float]] | None = None  # per response token, under the sampling distribution


@dataclass
class FinishedRow:
    """One response the moment it is final: `index` is its row in the call's prompt-major order."""

    index: int
    response: list[int]
    truncated: bool
    log_probs: list[float]


def gather(finished: Iterable[list[FinishedRow]], rows: int) -> Generations:
    """The rows of a `stream_ids` call in prompt-major order; every row must have been yielded once."""
    slots: list[FinishedRow | None] = [None] * rows
    for part in finished:
        for row in part:
            slots[row.index] = row
    missing = [i for i, row in enumerate(slots) if row is None]
    if missing:
        raise RuntimeError(f"the rollout engine never finished rows {missing[:8]} of {rows}")
    done = [row for row in slots if row is not None]
    return Generations(
        responses=[r.response for r in done],
        truncated=[r.truncated for r in done],
        log_probs=[r.log_probs for r in done],
    )


class RolloutEngine(Protocol):
    """What the trainer, evaluation and data preparation need from a sampler."""

    pad_token_id: int
    default_stop_ids: list[int]

    def generate_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Generations: ...

    def stream_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[list[FinishedRow]]:
        """The sampling of `generate_ids`, yielded in groups of rows as they finish (in no particular order)."""

    def score_ids(self, ids: list[int]) -> list[float]:
        """Log-probs of ids[1:], each given the ids before it, at temperature 1 (the weights push's self-test)."""

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights in place from (HF name, full tensor) pairs, streamed one at a time."""

    def sleep(self) -> None:
        """Free accelerator memory (KV cache, weights) while the trainer runs; a no-op where unsupported."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Undo `sleep` before the next weights push and generation: all of it (tags None), or only "weights" or
        "kv_cache" (a weights push needs only the weights' memory)."""


def check_prompts(prompts: list[list[int]], sampling: SamplingParams) -> None:
    sampling.check()
    if sampling.row_seeds is not None and len(sampling.row_seeds) != len(prompts) * sampling.n:
        raise ValueError(
            f"row_seeds has {len(sampling.row_seeds)} seeds for {len(prompts)} prompts x n={sampling.n} rows"
        )
    if sampling.row_budgets is not None:
        if len(sampling.row_budgets) != len(prompts) * sampling.n:
            raise ValueError(
                f"row_budgets has {len(sampling.row_budgets)} budgets for {len(prompts)} prompts x n={sampling.n}"
            )
        if not all(1 <= b <= sampling.max_response_length for b in sampling.row_budgets):
            raise ValueError(f"every row budget must be in [1, {sampling.max_response_length}]")
    if any(len(p) == 0 for p in prompts):
        raise UserError("Every prompt needs at least one token; found an empty prompt.")
