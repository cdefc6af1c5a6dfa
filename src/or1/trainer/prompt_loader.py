"""The training prompt loader: or1 rows -> chat-templated prompt ids, shuffled per epoch, resumable.

Each step takes the next `batch_size` prompts of the current epoch's permutation (drawn from the seed and the epoch
number, so a resumed run sees exactly the same order); a partial tail starts the next epoch. Prompts longer than
max_prompt_length tokens are dropped once, at load time, and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from or1.data.prompts import encode_prompts
from or1.data.records import prompt_key
from or1.hybrid.batch import Batch
from or1.hybrid.columns import ABILITY, DATA_SOURCE, PROMPT_IDS, PROMPT_KEY, REWARD_MODEL, UID

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


@dataclass
class LoaderState:
    """Where the loader stands: restored on resume."""

    epoch: int = 0
    position: int = 0  # prompts of this epoch's permutation already handed out


class PromptLoader:
    """Batches of prompts (non-tensor columns: prompt_ids, uid, prompt_key, ability, reward_model, data_source)."""

    def __init__(
        self,
        files: Sequence[str | Path],
        tokenizer: PreTrainedTokenizerBase,
        *,
        batch_size: int,
        max_prompt_length: int,
        seed: int,
        shuffle: bool = True,
        keep_keys: set[str] | None = None,
    ):
        # online filtering between stages keeps only keep_keys' prompts
        self.rows, self.too_long = encode_prompts(
            files, tokenizer, batch_size=batch_size, max_prompt_length=max_prompt_length, keep_keys=keep_keys
        )
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.state = LoaderState()

    def __len__(self) -> int:
        return len(self.rows)

    def _order(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.rows))
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.rows))

    def next_batch(self, step: int, round_: int = 0) -> Batch:
        """The next batch_size prompts of step `step`, their uids the GRPO groups.

        `round_` > 0 are the extra sampling rounds of a refilled (dynamic-sampling) step: distinct uids (and, in its
        SamplingRequest, seeds).
        """
        if self.state.position + self.batch_size > len(self.rows):
            self.state = LoaderState(epoch=self.state.epoch + 1, position=0)
        order = self._order(self.state.epoch)[self.state.position : self.state.position + self.batch_size]
        self.state.position += self.batch_size
        picked = [self.rows[i] for i in order]
        columns = {
            PROMPT_IDS: [ids for _, ids in picked],
            # the GRPO groups
            UID: [f"{step}.{round_}-{j}" if round_ else f"{step}-{j}" for j in range(len(picked))],
            PROMPT_KEY: [prompt_key(row) for row, _ in picked],
            ABILITY: [row["ability"] for row, _ in picked],
            REWARD_MODEL: [dict(row["reward_model"]) for row, _ in picked],
            DATA_SOURCE: [row["data_source"] for row, _ in picked],
        }
        return Batch.from_dict(columns)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.state.epoch, "position": self.state.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.state = LoaderState(epoch=int(state["epoch"]), position=int(state["position"]))
