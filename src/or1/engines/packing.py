"""Micro-batches as the model sees them: cut to the longest prompt and response (padded), or the real tokens of
several sequences packed end to end into as few rows as fit (`remove_padding`), and the way back to the [b, R]
response layout the FSDP engines return.

Packed rows restart position ids at 0 per sequence and carry no attention mask, from which transformers builds a
mask that keeps attention inside each sequence, so almost no compute goes to pad tokens. `token_budget_slices` and
`even_slices` cut a batch into micro- and mini-batches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

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


def pack_rows(lengths: list[int]) -> tuple[int, list[list[int]]]:
    """Sequences of these lengths packed end to end into rows: the row width and each row's sequence indices.

    First-fit decreasing, at the width from the longest sequence to twice it (in eighths) that needs the fewest
    positions in all (the narrowest of equals: attention costs width x positions). One dense row for everything
    would be the fewest positions, but CPU attention (sdpa, eager) then masks a square over the whole row.
    """
    longest = max(lengths)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best: tuple[int, list[list[int]]] | None = None
    for width in sorted({math.ceil(longest * (8 + k) / 8) for k in range(9)}):
        rows: list[list[int]] = []
        room: list[int] = []
        for i in order:
            row = next((r for r, free in enumerate(room) if free >= lengths[i]), None)
            if row is None:
                rows.append([])
                room.append(width)
                row = len(rows) - 1
            rows[row].append(i)
            room[row] -= lengths[i]
        if best is None or len(rows) * width < len(best[1]) * best[0]:
            best = (width, rows)
    assert best is not None
    return best


@dataclass(frozen=True)
class Window:
    """A micro-batch as the model sees it, and the way back from per-position outputs to the [b, R] layout.

    Position t's output belongs to response token t + 1 (the causal LM's logits predict it; the critic's value is
    the state before it). `keep` says which positions those are: the last `keep` columns of a padded window, or the
    flat indices into a packed window's rows. `logits_to_keep` is what the causal LM is asked for (only those
    positions where it can pick them itself: padded, or one packed row) and `kept` turns its logits into
    response-aligned outputs ([b, R'] padded, [1, N] packed, like `targets`); `picked` does the same for outputs of
    every position (the critic's), and `scatter` puts response-aligned values into [b, R] with 0 where a row has no
    token.
    """

    inputs: dict[str, torch.Tensor]  # input_ids, position_ids (and attention_mask when padded)
    keep: int | torch.Tensor
    targets: torch.Tensor  # the response tokens, response-aligned
    real: torch.Tensor  # [b, R] bool: slots that hold a response token
    packed: bool

    @property
    def logits_to_keep(self) -> int | torch.Tensor:
        one_row = self.inputs["input_ids"].shape[0] == 1
        return 0 if self.packed and not one_row else self.keep  # 0: every position

    def kept(self, outputs: torch.Tensor) -> torch.Tensor:
        if not self.packed:
            return outputs[:, :-1]
        return outputs if self.inputs["input_ids"].shape[0] == 1 else self.picked(outputs)

    def picked(self, outputs: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return outputs.reshape(1, -1, *outputs.shape[2:])[:, self.keep]
        return outputs[:, -self.keep : -1]

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
    return Window(inputs, keep_resp + 1, targets, micro[ATTENTION_MASK][:, prompt_width:].bool(), False)


def packed_window(micro: dict[str, torch.Tensor], *, one_row: bool = False) -> Window:
    """The real tokens of the rows packed end to end, position ids restarting at 0 per sequence: into the rows
    `pack_rows` chooses, or all into a single row. A row's unused tail is one more sequence (pad ids, positions
    from 0) whose outputs are never read.

    Every row needs a prompt token: the first response token is predicted from the position before it.
    """
    ids, mask = micro[INPUT_IDS], micro[ATTENTION_MASK]
    prompt_width = ids.shape[1] - micro[RESPONSES].shape[1]
    valid = mask.bool()
    if not bool(valid[:, :prompt_width].any(-1).all()):
        raise ValueError("packed micro-batches need at least one prompt token per row")
    lengths = valid.sum(-1)
    if one_row:
        width, rows = int(lengths.sum()), [list(range(len(lengths)))]
    else:
        width, rows = pack_rows(lengths.tolist())
    start = torch.empty_like(lengths)  # each sequence's first index in the flattened rows
    used = torch.empty(len(rows), dtype=lengths.dtype)
    for r, members in enumerate(rows):
        offsets = lengths[members].cumsum(0)
        start[members] = r * width + offsets - lengths[members]
        used[r] = offsets[-1]
    position = mask.cumsum(-1) - 1  # each real token's position in its sequence
    where = start[:, None] + position  # ... and its index in the flattened rows
    column = torch.arange(width)
    flat_positions = (column[None] - used[:, None]).clamp(min=0)  # the tails count from 0
    flat_positions.view(-1)[where[valid]] = position[valid]
    flat_ids = ids.new_zeros(len(rows) * width)
    flat_ids[where[valid]] = ids[valid]
    real = valid[:, prompt_width:]
    inputs = {"input_ids": flat_ids.view(len(rows), width), "position_ids": flat_positions}
    keep = where[:, prompt_width:][real] - 1  # the position before each response token
    return Window(inputs, keep, micro[RESPONSES][real][None], real, True)
