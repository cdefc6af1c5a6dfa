"""Sampling backends for evaluation: the same rollout engines training uses, behind one small interface.

A `Sampler` takes chat prompts (one entry per sample to draw, repeats allowed) and a seed, and returns one
`Completion` per entry. `hf` wraps `HFRolloutEngine` (CPU or one GPU); `vllm` wraps vLLM's offline `LLM`, imported
only when chosen so the CPU install never needs it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1.errors import UserError
from or1.eval.protocols import EvalSampling

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Completion:
    """One sampled response: its text, its length in tokens, and whether it hit the token budget."""

    text: str
    num_tokens: int
    truncated: bool


Sampler = Callable[[list[Messages], int], list[Completion]]  # (prompts, seed) -> one completion per prompt
DEFAULT_BATCH = {
    "hf": 32,
    "vllm": 1024,
}  # samples per generate call: small on CPU, large enough to fill a GPU


def chat_ids(tokenizer: Any, messages: Messages) -> list[int]:
    """Token ids of `messages` under the tokenizer's chat template, ready for the assistant's turn."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def hf_sampler(engine: Any, tokenizer: Any, sampling: EvalSampling) -> Sampler:
    """A Sampler over an `HFRolloutEngine`; the trainer can build one around its own engine for validation."""
    from or1.engines.hf_rollout import SamplingParams

    def sample(prompts: list[Messages], seed: int) -> list[Completion]:
        params = SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_new_tokens=sampling.max_tokens,
            seed=seed,
        )
        out = engine.generate_ids([chat_ids(tokenizer, m) for m in prompts], params)
        return [
            Completion(tokenizer.decode(ids, skip_special_tokens=True), len(ids), cut)
            for ids, cut in zip(out.responses, out.truncated, strict=True)
        ]

    return sample


def engine_generate_fn(
    engine: Any, tokenizer: Any, *, temperature: float, top_p: float, max_tokens: int, seed: int | None = None
) -> Callable[[list[Messages], int], list[list[Completion]]]:
    """A `generate_fn` for `runner.evaluate_rows` over an HFRolloutEngine: n samples per prompt, prompt-major.

    This is the trainer's validation path: it passes the engine it already holds (weights synced), so nothing loads.
    """
    from or1.engines.hf_rollout import SamplingParams

    def generate(prompts: list[Messages], n: int) -> list[list[Completion]]:
        params = SamplingParams(
            n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_tokens, seed=seed
        )
        out = engine.generate_ids([chat_ids(tokenizer, m) for m in prompts], params)
        flat = [
            Completion(tokenizer.decode(ids, skip_special_tokens=True), len(ids), cut)
            for ids, cut in zip(out.responses, out.truncated, strict=True)
        ]
        return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]

    return generate


def load_hf_sampler(model: Path | str, sampling: EvalSampling, *, micro_batch_size: int = 32) -> Sampler:
    """Load `model` with transformers and sample with HFRolloutEngine (float32 on CPU, bfloat16 on a GPU)."""
    import torch

    from or1.engines.hf_rollout import HFRolloutEngine
    from or1.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model)
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    lm = load_causal_lm(model, dtype)
    if torch.cuda.is_available():
        lm = lm.to("cuda")
    return hf_sampler(HFRolloutEngine(lm, tokenizer, micro_batch_size=micro_batch_size), tokenizer, sampling)


def load_vllm_sampler(model: Path | str, sampling: EvalSampling) -> Sampler:
    """Sample with vLLM's offline engine; each sample gets its own seed so a resumed run draws the same ones."""
    try:
        import vllm
    except ImportError:
        raise UserError(
            "--engine vllm needs vLLM: install the vllm extra (pip install 'or1[vllm]'), or use --engine hf."
        ) from None
    from or1.models.loading import load_tokenizer

    tokenizer = load_tokenizer(model)
    llm = vllm.LLM(model=str(model), seed=sampling.seed, enable_prefix_caching=True)

    def sample(prompts: list[Messages], seed: int) -> list[Completion]:
        params = [
            vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.max_tokens,
                seed=seed + i,
            )
            for i in range(len(prompts))
        ]
        requests = [{"prompt_token_ids": chat_ids(tokenizer, m)} for m in prompts]
        outputs = llm.generate(requests, params, use_tqdm=False)
        done = [o.outputs[0] for o in outputs]
        return [Completion(c.text, len(c.token_ids), c.finish_reason == "length") for c in done]

    return sample


def load_sampler(engine: str, model: Path | str, sampling: EvalSampling) -> Sampler:
    """The Sampler for `engine` ("hf" or "vllm")."""
    if engine == "hf":
        return load_hf_sampler(model, sampling)
    if engine == "vllm":
        return load_vllm_sampler(model, sampling)
    raise UserError(f"Unknown engine {engine!r}; choose hf or vllm.")
