"""The vLLM rollout engine: the same `generate_ids` as the Hugging Face loop, served by vLLM (CPU or GPU).

In training, one engine lives in each rank's process beside the FSDP2 actor and receives its weights after every
update (`load_weights`, streamed tensor by tensor); on a GPU it sleeps while the actor trains. Standalone (eval,
difficulty estimation) it is an in-process engine over a saved model folder. vLLM's internals stay in
`or1.engines.vllm_compat`.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from or1.engines import vllm_compat
from or1.engines.rollout import (
    EngineSettings,
    FinishedRow,
    Generations,
    SamplingParams,
    check_prompts,
    gather,
)
from or1.errors import UserError


class VLLMRolloutEngine:
    """n samples per prompt from token ids; each sample is its own seeded request, so results do not depend on how
    requests are batched. `distributed=True` joins the training ranks' torch.distributed world."""

    def __init__(
        self, model_path: str | Path, stop_ids: list[int], pad_token_id: int, settings: EngineSettings
    ):
        self.vllm = vllm_compat.import_vllm()
        self.llm = vllm_compat.start_engine(str(model_path), settings)
        self.max_model_len = vllm_compat.max_model_len(self.llm)
        self.default_stop_ids = list(stop_ids)
        self.pad_token_id = pad_token_id
        self.can_sleep = vllm_compat.sleep_supported(self.llm)
        self.asleep = False

    def generate_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Generations:
        """Sample `sampling.n` responses for each prompt (lists of token ids, no padding)."""
        return gather(self.stream_ids(prompts, sampling), len(prompts) * sampling.n)

    def stream_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[list[FinishedRow]]:
        """The rows of `generate_ids`, yielded after each engine step that finished some."""
        check_prompts(prompts, sampling)
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise UserError(
                f"a prompt of {longest} tokens does not fit the vLLM engine's context of {self.max_model_len} "
                "tokens (the model's max_position_embeddings or the configured limit); drop long prompts or use a "
                "model with a longer context"
            )
        rows = [prompt for prompt in prompts for _ in range(sampling.n)]
        stop = sampling.stop_token_ids or self.default_stop_ids
        params = [
            self.vllm.SamplingParams(
                n=1,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_tokens=sampling.budget(i),
                stop_token_ids=stop,
                seed=_row_seed(sampling, i),
                logprobs=0,  # the sampled token's own log-prob
                detokenize=False,
            )
            for i in range(len(rows))
        ]
        requests = [vllm_compat.tokens_prompt(r) for r in rows]
        for done in vllm_compat.stream_finished(self.llm, requests, params):
            yield [_finished_row(index, out.outputs[0]) for index, out in done]

    def score_ids(self, ids: list[int]) -> list[float]:
        """Log-probs of ids[1:], each given the ids before it, at temperature 1 (vLLM's prompt log-probs)."""
        params = self.vllm.SamplingParams(
            n=1, temperature=1.0, max_tokens=1, prompt_logprobs=0, detokenize=False, seed=0
        )
        out = self.llm.generate([vllm_compat.tokens_prompt(ids)], [params], use_tqdm=False)[0]
        return [step[token].logprob for step, token in zip(out.prompt_logprobs[1:], ids[1:], strict=True)]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights in place from (HF name, full tensor) pairs; the prefix cache is reset."""
        vllm_compat.reload_weights(self.llm, weights)

    def sleep(self) -> None:
        """Free GPU memory (weights offloaded to host, KV cache dropped) while the actor trains; no-op on CPU."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what `sleep` freed: everything (tags None), or only "weights" / "kv_cache" (vLLM's tags; the
        engine schedules again once both are back)."""
        if self.asleep and self.llm.wake_up(tags=tags):  # True once fully awake
            self.asleep = False


def _finished_row(index: int, sample: Any) -> FinishedRow:
    ids = list(sample.token_ids)
    log_probs = [step[token].logprob for step, token in zip(sample.logprobs, ids, strict=True)]
    return FinishedRow(index, ids, sample.finish_reason == "length", log_probs)


def _row_seed(sampling: SamplingParams, index: int) -> int | None:
    if sampling.row_seeds is not None:
        return sampling.row_seeds[index]
    return None if sampling.seed is None else request_seed(sampling.seed, index)


def request_seed(seed: int, index: int) -> int:
    """The seed of the index-th request of a call: distinct per sample, fixed by (seed, index)."""
    return zlib.crc32(f"{seed}:{index}".encode()) & 0x7FFFFFFF
