"""The Hugging Face rollout engine: samples n responses per prompt from a causal LM (CPU or one GPU).

It keeps the conventions of `or1.engines.rollout`. It runs its own decode loop over the model's forward (left-padded micro-batches,
a KV cache, finished rows dropped from the batch): on the tiny model, 16 prompts x 8 samples took 0.68 s against
0.88 s for `model.generate` with do_sample on the same left-padded batch (one thread, shared 2-core machine).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from dataclasses import replace

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from or1.engines.cpu_attention import use_grouped_sdpa
from or1.engines.rollout import FinishedRow, Generations, SamplingParams, check_prompts, gather
from or1.errors import UserError
from or1.tokens import pad_id

Generator = torch.Generator | list[torch.Generator]  # one for the call, or one per row


class HFRolloutEngine:
    """Batched sampling on a Hugging Face causal LM (CPU or one GPU), reproducible given `SamplingParams.seed`.

    A seeded call gives the same tokens for the same prompts, sampling settings and micro_batch_size; with
    `row_seeds` each row draws from a generator of its own, so its tokens do not depend on the other rows.
    """

    def __init__(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, *, micro_batch_size: int = 128
    ):
        if micro_batch_size < 1:
            raise UserError(f"micro_batch_size must be at least 1, got {micro_batch_size}.")
        if model.device.type == "cpu":
            use_grouped_sdpa(model)
        self.model = model
        self.micro_batch_size = micro_batch_size
        self.pad_token_id = pad_id(tokenizer)
        eos = model.generation_config.eos_token_id if model.generation_config is not None else None
        eos = tokenizer.eos_token_id if eos is None else eos
        self.default_stop_ids = [eos] if isinstance(eos, int) else list(eos)
        # transformers 5.24 renamed past_key_values to cache; older releases only know the old name
        self._cache_kwarg = (
            "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        )

    def generate_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Generations:
        """Sample `sampling.n` responses for each prompt (lists of token ids, no padding)."""
        return gather(self.stream_ids(prompts, sampling), len(prompts) * sampling.n)

    def stream_ids(self, prompts: list[list[int]], sampling: SamplingParams) -> Iterator[list[FinishedRow]]:
        """The rows of `generate_ids`, yielded at each decode step that finished some (micro-batch by micro-batch)."""
        check_prompts(prompts, sampling)
        rows = [prompt for prompt in prompts for _ in range(sampling.n)]
        generators = self._generators(sampling)
        stop_ids = torch.tensor(sampling.stop_token_ids or self.default_stop_ids, device=self.model.device)
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(rows), self.micro_batch_size):
                chunk = rows[start : start + self.micro_batch_size]
                generator = (
                    generators[start : start + self.micro_batch_size]
                    if isinstance(generators, list)
                    else generators
                )
                budgets = [sampling.budget(row) for row in range(start, start + len(chunk))]
                for finished in self._decode(chunk, budgets, sampling, stop_ids, generator):
                    yield [replace(row, index=start + row.index) for row in finished]
        finally:
            self.model.train(was_training)

    def _generators(self, sampling: SamplingParams) -> Generator | None:
        """One generator for the call (`seed`), one per row (`row_seeds`), or None (unseeded)."""
        device = self.model.device
        if sampling.row_seeds is not None:
            return [torch.Generator(device=device).manual_seed(s) for s in sampling.row_seeds]
        if sampling.seed is not None:
            return torch.Generator(device=device).manual_seed(sampling.seed)
        return None

    def _decode(
        self,
        rows: list[list[int]],
        budgets: list[int],
        sampling: SamplingParams,
        stop_ids: torch.Tensor,
        generator: Generator | None,
    ) -> Iterator[list[FinishedRow]]:
        """One left-padded micro-batch through the decode loop, each row for at most its budget of tokens; finished
        rows leave the batch and are yielded (inference mode is held only inside each step, never across a yield)."""
        device = self.model.device
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long, device=device)
        mask = torch.zeros((len(rows), width), dtype=torch.long, device=device)
        for i, row in enumerate(rows):  # left padding: every row's next token sits in the last column
            input_ids[i, width - len(row) :] = torch.tensor(row, device=device)
            mask[i, width - len(row) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        alive = torch.arange(len(rows), device=device)  # original row index of each batch row still sampling
        budget = torch.tensor(budgets, device=device)
        tokens: list[list[int]] = [[] for _ in rows]
        token_log_probs: list[list[float]] = [[] for _ in rows]
        step_ids, step_pos = input_ids, positions
        for step in range(max(budgets)):
            with torch.inference_mode():
                logits = self.model(
                    input_ids=step_ids,
                    attention_mask=mask,
                    position_ids=step_pos,
                    use_cache=True,
                    logits_to_keep=1,
                    **{self._cache_kwarg: cache},
                ).logits[:, -1, :]
                row_generator = (
                    [generator[i] for i in alive.tolist()] if isinstance(generator, list) else generator
                )
                next_ids, next_log_probs = sample_next(
                    logits, sampling.temperature, sampling.top_p, row_generator
                )
                hit = torch.isin(next_ids, stop_ids)
                ended = hit | (budget[alive] == step + 1)  # a stop token, or the row's budget's last token
                finished = []
                for row, token, lp, is_stop, is_end in zip(
                    alive.tolist(),
                    next_ids.tolist(),
                    next_log_probs.tolist(),
                    hit.tolist(),
                    ended.tolist(),
                    strict=True,
                ):
                    tokens[row].append(token)
                    token_log_probs[row].append(lp)
                    if is_end:  # at the budget without a stop: truncated
                        finished.append(FinishedRow(row, tokens[row], not is_stop, token_log_probs[row]))
                keep = (~ended).nonzero().squeeze(-1)
                if 0 < keep.numel() < alive.numel():  # later steps only pay for live rows
                    cache.batch_select_indices(keep)
                    alive, next_ids, mask, step_pos = alive[keep], next_ids[keep], mask[keep], step_pos[keep]
                step_ids = next_ids[:, None]
                step_pos = step_pos[:, -1:] + 1
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
            if finished:
                yield finished
            if keep.numel() == 0:
                return

    def score_ids(self, ids: list[int]) -> list[float]:
        """Log-probs of ids[1:], each given the ids before it, at temperature 1 (one forward, float32 softmax)."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                tokens = torch.tensor([ids], device=self.model.device)
                logits = self.model(input_ids=tokens, use_cache=False).logits[0, :-1].float()
        finally:
            self.model.train(was_training)
        return logits.log_softmax(-1).gather(-1, tokens[0, 1:, None]).squeeze(-1).tolist()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy named full tensors into the model in place (tied weights may arrive under either name)."""
        targets = self.model.state_dict(keep_vars=True)
        with torch.no_grad():
            for name, tensor in weights:
                if name not in targets:
                    raise KeyError(f"load_weights: the rollout model has no tensor named {name!r}")
                targets[name].copy_(tensor.to(device=targets[name].device, dtype=targets[name].dtype))

    def sleep(self) -> None:
        """No-op: on CPU the KV cache lives only inside a generate call and the weights are needed right after."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """No-op, for the same reason as sleep (vLLM's engine frees and restores GPU memory here)."""


def sample_next(
    logits: torch.Tensor, temperature: float, top_p: float, generator: Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row from `logits` (batch, vocab) and its log-prob under the sampling distribution.

    Greedy at temperature 0 (the log-prob is then the unscaled one), else nucleus sampling, drawn from one
    generator for the batch or from each row's own (a list, one per row).
    """
    if temperature == 0:
        chosen = logits.argmax(dim=-1)
        return chosen, logits.float().log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1)
    logits = logits.float() / temperature
    if top_p < 1.0:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # the top token always stays
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(dim=-1)
    if isinstance(generator, list):
        chosen = torch.stack(
            [torch.multinomial(p, 1, generator=g) for p, g in zip(probs, generator, strict=True)]
        )
    else:
        chosen = torch.multinomial(probs, 1, generator=generator)
    return chosen.squeeze(-1), logits.log_softmax(dim=-1).gather(-1, chosen).squeeze(-1)
