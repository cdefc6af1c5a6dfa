"""Micro-batches as the model sees them: cut to the longest prompt and response (padded), or the real tokens of
every sequence packed end to end into one row (`remove_padding`), and the way back to the [b, R] response layout the
FSDP engines return.

A packed row restarts position ids at 0 per sequence and carries the sequences' boundaries (`varlen.Segments`),
which the packed attention (`varlen`, `ulysses`) keeps each sequence inside, so no compute goes to pad tokens and
nothing grows with the square of the row. `token_budget_slices` and `even_slices` cut a batch into micro- and
mini-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from or1.engines.varlen import Segments
from or1.hybrid.columns import ATTENTION_MASK, INPUT_IDS, RESPONSES


def even_slices(rows: int, parts: int) -> list[slice]:
    """`parts` contiguous ranges covering `rows` as evenly as possible (fewer when rows < parts)."""
    parts = max(1, min(parts, rows))
    size = math.ceil(rows / parts)
    return [slice(i, min(i + size, rows)) for i in range(0, rows, size)]


def token_budget_slices(lengths: list[int], budget: int) -> list[slice]:
    """Consecutive row ranges whose token counts add up to at most `budget` (a longer row gets a range alone)."""
    slices, start, used = [], 0, 0
    for row, length in enumerate(lengths):
        if row > start and used + length > budget:
            slices.append(slice(start, row))
            start, used = row, 0
        used += length
    if len(lengths) > start:
        slices.append(slice(start, len(lengths)))
    return slices


@dataclass(frozen=True)
class Window:
    """A micro-batch as the model sees it, and the way back from per-position outputs to the [b, R] layout.

    Position t's output belongs to response token t + 1 (the causal LM's logits predict it; the critic's value is
    the state before it). `keep` says which positions those are: the last `keep` columns of a padded window, or the
    indices into a packed row. `logits_to_keep` is what the causal LM is asked for (only those positions), and
    `kept` turns its logits into response-aligned outputs ([b, R'] padded, [1, N] packed, like `targets`); `picked`
    does the same for outputs of every position (the critic's), and `scatter` puts response-aligned values into
    [b, R] with 0 where a row has no token.
    """

    inputs: dict[str, torch.Tensor | Segments]  # input_ids, position_ids, and attention_mask or segments
    keep: int | torch.Tensor
    targets: torch.Tensor  # the response tokens, response-aligned
    real: torch.Tensor  # [b, R] bool: slots that hold a response token
    segments: Segments | None = None  # a packed row's sequences (None: padded rows)

    @property
    def packed(self) -> bool:
        return self.segments is not None

    @property
    def logits_to_keep(self) -> int | torch.Tensor:
        return self.keep

    def kept(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs if self.packed else outputs[:, :-1]

    def picked(self, outputs: torch.Tensor) -> torch.Tensor:
        return outputs[:, self.keep] if self.packed else outputs[:, -self.keep : -1]

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return values.new_zeros(self.real.shape).masked_scatter(self.real, values.reshape(-1))
        # 0 on rows shorter than the longest
        values = values * self.real[:, : values.shape[1]].to(values.dtype)
        return torch.nn.functional.pad(values, (0, self.real.shape[1] - values.shape[1]))


def padded_window(micro: dict[str, torch.Tensor]) -> Window:
    """The micro-batch cut to its longest prompt and longest response R' (left / right padding kept)."""
    ids, mask = micro[INPUT_IDS], micro[ATTENTION_MASK]
    prompt_width = ids.shape[1] - micro[RESPONSES].shape[1]
    keep_resp = max(1, int(mask[:, prompt_width:].sum(-1).max()))  # longest response in this micro-batch
    first = int(prompt_width - mask[:, :prompt_width].sum(-1).max())  # longest prompt's first column
    end = prompt_width + keep_resp
    ids, mask = ids[:, first:end], mask[:, first:end]
    inputs = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    # the last R' + 1 positions predict the R' responses (the very last predicts nothing kept)
    targets = micro[RESPONSES][:, :keep_resp]
    return Window(inputs, keep_resp + 1, targets, micro[ATTENTION_MASK][:, prompt_width:].bool())


def packed_window(micro: dict[str, torch.Tensor]) -> Window:
    """The real tokens of every row packed end to end into one row [1, N], position ids restarting at 0 per
    sequence, with the sequences' lengths (`segments`, the attention's boundaries).

    Every row needs a prompt token: the first response token is predicted from the position before it.
    """
    ids, mask = micro[INPUT_IDS], micro[ATTENTION_MASK]
    prompt_width = ids.shape[1] - micro[RESPONSES].shape[1]
    valid = mask.bool()
    if not bool(valid[:, :prompt_width].any(-1).all()):
        raise ValueError("packed micro-batches need at least one prompt token per row")
    lengths = valid.sum(-1)
    segments = Segments(tuple(lengths.tolist()))
    # each real token's position in its sequence (a row's real tokens are contiguous)
    position = mask.cumsum(-1) - 1
    where = (lengths.cumsum(0) - lengths)[:, None] + position  # ... and its index in the packed row
    real = valid[:, prompt_width:]
    inputs = {"input_ids": ids[valid][None], "position_ids": position[valid][None], "segments": segments}
    keep = where[:, prompt_width:][real] - 1  # the position before each response token
    return Window(inputs, keep, micro[RESPONSES][real][None], real, segments)
