"""A rollout call's rows on one rank: streamed to the controller as they finish, then packed into the call's Batch.

Columns of the Batch (B = prompts x n, P = max_prompt_length, R = the response budget): tensors `input_ids` /
`attention_mask` [B, P + R] (prompt left-padded, response right-padded), `responses`, `response_mask`,
`rollout_log_probs` [B, R] (the sampler's own log-probs), `truncated`, `response_length` [B]; non-tensor
`response_text`, and every non-tensor column of the prompts but `prompt_ids`, repeated n times (`uid`, one per
prompt: the GRPO group).
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch

from or1.engines.rollout import FinishedRow, gather
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ABILITY,
    ATTENTION_MASK,
    INPUT_IDS,
    PROMPT_IDS,
    RESPONSE_LENGTH,
    RESPONSE_MASK,
    RESPONSE_TEXT,
    RESPONSES,
    REWARD_MODEL,
    ROLLOUT_LOG_PROBS,
    TRUNCATED,
    reward_input,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

FINISHED_GROUPS = 8  # finished rows go to the controller in about this many groups per call


class FinishedRows:
    """This rank's rows of one rollout call as the engine finishes them: decoded, their reward inputs handed out in
    about FINISHED_GROUPS groups, and at the end packed into the call's Batch.

    `mine` are this rank's prompts among its tensor-parallel group's (the engine samples the group's prompts
    together, n rows per prompt in prompt-major order); their rows are this rank's. A reward input is
    {"key": its row in the controller's whole batch, "ability", "response", "reward_model"}: the controller splits a
    batch into equal rank shares in rank order, so that row is rank x share + row here. Prompts without ability and
    reward_model columns give none.
    """

    def __init__(
        self, prompts: Batch, mine: slice, n: int, rank: int, tokenizer: PreTrainedTokenizerBase
    ) -> None:
        self.prompts, self.n, self.rank, self.tokenizer = prompts, n, rank, tokenizer
        self.rows = range(mine.start * n, mine.stop * n)
        self.readable = all(column in prompts for column in (ABILITY, REWARD_MODEL))
        self.finished: list[FinishedRow] = []  # this rank's rows, indexed from 0
        self.text: list[str] = [""] * len(self.rows)
        self.ready: list[dict[str, Any]] = []
        self.group = max(1, -(-len(self.rows) // FINISHED_GROUPS))

    def add(self, part: list[FinishedRow]) -> list[dict[str, Any]]:
        """Take rows the engine finished (this rank's among them); a full group of reward inputs, else []."""
        mine = [row for row in part if row.index in self.rows]
        decoded = self.tokenizer.batch_decode([row.response for row in mine], skip_special_tokens=True)
        for row, words in zip(mine, decoded, strict=True):
            local = row.index - self.rows.start
            self.finished.append(replace(row, index=local))
            self.text[local] = words
            if self.readable:
                prompt = local // self.n
                key = self.rank * len(self.rows) + local
                inputs = reward_input(
                    self.prompts[ABILITY][prompt], words, self.prompts[REWARD_MODEL][prompt]
                )
                self.ready.append({"key": key, **inputs})
        return self.rest() if len(self.ready) >= self.group else []

    def rest(self) -> list[dict[str, Any]]:
        """The reward inputs not handed out yet."""
        ready, self.ready = self.ready, []
        return ready

    def batch(
        self, prompt_ids: list[list[int]], prompt_width: int, max_response_length: int, pad_id: int
    ) -> Batch:
        """The call's Batch of this rank's rows (`prompt_ids`: this rank's prompts), once every row finished."""
        out = gather([self.finished], len(self.rows))
        return sampled_batch(
            self.prompts,
            prompt_ids,
            self.n,
            (out.responses, out.truncated, out.log_probs or []),
            self.text,
            (prompt_width, max_response_length, pad_id),
        )


def sampled_batch(
    prompts: Batch,
    prompt_ids: list[list[int]],
    n: int,
    sampled: tuple[list[list[int]], list[bool], list[list[float]]],
    text: list[str],
    layout: tuple[int, int, int],
) -> Batch:
    """The Batch of `prompts`' n responses each: `sampled` is (responses, truncated, log-probs), prompt-major, `text`
    the decoded responses, `layout` (prompt width, response width, pad id)."""
    responses, truncated, log_probs = sampled
    prompt_width, response_width, pad_id = layout
    repeated = prompts.drop([PROMPT_IDS]).repeat(n, interleave=True)
    tensors = pack_sequences(
        [p for p in prompt_ids for _ in range(n)], responses, prompt_width, response_width, pad_id
    )
    tensors[ROLLOUT_LOG_PROBS] = pad_rows(log_probs, response_width)
    tensors[TRUNCATED] = torch.tensor(truncated, dtype=torch.bool)
    return repeated.union(Batch(tensors, {RESPONSE_TEXT: text}))


def pack_sequences(
    prompts: list[list[int]], responses: list[list[int]], prompt_width: int, response_width: int, pad_id: int
) -> dict[str, torch.Tensor]:
    """Fixed-width tensors (so ranks' shares concatenate): left-padded prompts, right-padded responses."""
    b = len(prompts)
    ids = torch.full((b, prompt_width + response_width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        p = p[-prompt_width:]  # the loader already dropped longer prompts; this only guards the layout
        ids[i, prompt_width - len(p) : prompt_width] = torch.tensor(p)
        ids[i, prompt_width : prompt_width + len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, prompt_width - len(p) : prompt_width + len(r)] = 1
    response_mask = mask[:, prompt_width:].clone()
    return {
        INPUT_IDS: ids,
        ATTENTION_MASK: mask,
        RESPONSES: ids[:, prompt_width:].clone(),
        RESPONSE_MASK: response_mask,
        RESPONSE_LENGTH: response_mask.sum(-1),
    }


def pad_rows(
    rows: list[list[float]] | list[list[int]], width: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Rows of up to `width` values as one [len(rows), width] tensor, zero-padded on the right."""
    out = torch.zeros((len(rows), width), dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out
