"""Causal attention over the sequences of a packed row, from their boundaries: no [T, T] mask anywhere.

A packed row lays sequences end to end (`packing.packed_window`); attention must keep each to itself. The boundaries
travel with the forward pass as a `Segments` (each sequence's length, from the packing, once per micro-batch), passed
to the model as the keyword `segments`, which transformers hands on to every attention call (also when activation
checkpointing re-runs a block). Two kernels read them:

- **flash** (CUDA, bfloat16 / float16, a GPU with flash attention): torch's own variable-length flash attention
  (`torch.nn.attention.varlen.varlen_attn`, cumulative sequence lengths and the longest length), grouped key/value
  heads as they are. The pinned torch ships it, so a GPU install needs no extra package built against it.
- **segments** (the CPU, and the CUDA fallback with a one-line warning): the sequences sorted by length and cut into
  groups whose lengths are within `GROUP_RATIO` of the group's longest; each group is gathered into a [n, heads,
  width, dim] batch, right-padded, and goes through torch's sdpa with `is_causal` (no mask: a causal query never sees
  the padding after it), grouped key/value heads as they are (`enable_gqa`). Compute and memory follow the sum of
  the groups' n x width^2 and n x width, which for sequences of similar length is each sequence's own.

`enable(model)` points a model at `attention` (registered with transformers as `or1_varlen`, with no mask function,
so transformers builds no mask for it); Ulysses (`ulysses.py`) calls `attend` between its all-to-alls.
"""

from __future__ import annotations

import inspect
import warnings
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, PreTrainedModel

ATTENTION = "or1_varlen"
# a sequence joins a group when it is at least this fraction of the group's longest: at most 1 / 0.8^2 ~ 1.6x the
# attention work of each sequence alone, 1.25x its positions, and a handful of kernel calls per layer
GROUP_RATIO = 0.8


@dataclass(frozen=True)
class Group:
    """Sequences of similar length, gathered right-padded: `index` [n, width] into the row (a sequence's last
    position repeated as padding), `real` [n, width] the positions that are its own."""

    index: torch.Tensor
    real: torch.Tensor


@dataclass(frozen=True)
class Segments:
    """The sequences of a packed row, by length, in row order: what attention keeps apart."""

    lengths: tuple[int, ...]
    _groups: dict[torch.device, tuple[list[Group], torch.Tensor]] = field(
        default_factory=dict, repr=False, compare=False
    )
    _cu_seqlens: dict[torch.device, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.lengths or min(self.lengths) < 1:
            raise ValueError(
                f"a packed row needs sequences of at least one token, got lengths {self.lengths}"
            )

    @property
    def total(self) -> int:
        return sum(self.lengths)

    @property
    def longest(self) -> int:
        return max(self.lengths)

    @cached_property
    def cu_seqlens(self) -> torch.Tensor:
        """[n + 1] int32: where each sequence starts, then the row's length (flash attention's boundaries)."""
        return F.pad(torch.tensor(self.lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))

    def cu_seqlens_on(self, device: torch.device) -> torch.Tensor:
        """`cu_seqlens` on `device`, copied there once per micro-batch (not once per layer)."""
        if device not in self._cu_seqlens:
            self._cu_seqlens[device] = self.cu_seqlens.to(device)
        return self._cu_seqlens[device]

    def then(self, length: int) -> Segments:
        """These sequences and one more of `length` after them (a row padded with a dummy sequence)."""
        return Segments((*self.lengths, length)) if length else self

    def groups(self, device: torch.device) -> tuple[list[Group], torch.Tensor]:
        """The length groups on `device`, and the permutation that puts their real positions (group by group, row by
        row) back in row order. Built once per micro-batch and device, then shared by every layer."""
        if device not in self._groups:
            self._groups[device] = self._build_groups(device)
        return self._groups[device]

    def _build_groups(self, device: torch.device) -> tuple[list[Group], torch.Tensor]:
        lengths = torch.tensor(self.lengths)
        starts = self.cu_seqlens[:-1].long()
        order = sorted(range(len(self.lengths)), key=lambda i: -self.lengths[i])
        members: list[list[int]] = []
        for i in order:
            if members and self.lengths[i] >= GROUP_RATIO * self.lengths[members[-1][0]]:
                members[-1].append(i)
            else:
                members.append([i])
        groups, positions = [], []
        for group in members:
            rows = torch.tensor(group)
            width = int(lengths[rows].max())
            column = torch.arange(width)
            real = column[None] < lengths[rows, None]
            index = starts[rows, None] + torch.minimum(column[None], lengths[rows, None] - 1)
            groups.append(Group(index.to(device), real.to(device)))
            positions.append(index[real])
        back = torch.empty(self.total, dtype=torch.long)
        back[torch.cat(positions)] = torch.arange(self.total)
        return groups, back.to(device)


def segment_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: Segments, scale: float | None
) -> torch.Tensor:
    """Causal attention inside each segment, group by group through sdpa: query [H, T, d], key / value [KV, T, d]
    -> [H, T, d]."""
    groups, back = segments.groups(query.device)
    parts = []
    for group in groups:
        q, k, v = (t[:, group.index].transpose(0, 1) for t in (query, key, value))  # [n, heads, width, d]
        out = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
        )
        parts.append(out.transpose(0, 1)[:, group.real])  # [H, the group's tokens, d]
    return torch.cat(parts, dim=1)[:, back]


def flash_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: Segments, scale: float | None
) -> torch.Tensor:
    """torch's variable-length flash attention: the same shapes as `segment_attention`."""
    from torch.nn.attention.varlen import varlen_attn

    cu = segments.cu_seqlens_on(query.device)
    grouped = {}
    repeat = query.shape[0] // key.shape[0]  # grouped-query attention: query heads per key-value head
    if repeat > 1 and "enable_gqa" in inspect.signature(varlen_attn).parameters:
        grouped = {"enable_gqa": True}
    elif repeat > 1:  # torch 2.11's kernel (seen on an H200) takes as many key-value heads as query heads
        key, value = key.repeat_interleave(repeat, dim=0), value.repeat_interleave(repeat, dim=0)
    q, k, v = (t.transpose(0, 1).contiguous() for t in (query, key, value))  # [T, heads, d]
    causal = (-1, 0)
    out = varlen_attn(
        q, k, v, cu, cu, segments.longest, segments.longest, scale=scale, window_size=causal, **grouped
    )
    return out.transpose(0, 1)


def flash_unusable(query: torch.Tensor) -> str | None:
    """Why torch's flash varlen kernel cannot take this query (None when it can)."""
    if query.device.type != "cuda":
        return "not on CUDA"
    if query.dtype not in (torch.bfloat16, torch.float16):
        return f"{query.dtype} (flash attention computes in bfloat16 or float16)"
    if not torch.backends.cuda.is_flash_attention_available():
        return "this torch build has no flash attention"
    if torch.cuda.get_device_capability(query.device) < (8, 0):
        return "the GPU predates flash attention (compute capability 8.0)"
    if query.shape[-1] > 256:
        return f"head dim {query.shape[-1]} (flash attention takes up to 256)"
    return None


def attend(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, segments: Segments, scale: float | None
) -> torch.Tensor:
    """Causal attention inside each segment of one packed row: query [1, H, T, d], key / value [1, KV, T, d] ->
    [1, T, H, d] (transformers' layout of an attention output), by the flash kernel where it runs."""
    if query.shape[0] != 1 or query.shape[2] != segments.total:
        raise ValueError(f"segments of {segments.total} tokens for a query of shape {tuple(query.shape)}")
    reason = flash_unusable(query)
    if reason is not None and query.device.type == "cuda":
        warnings.warn(
            f"packed attention runs per segment through sdpa, not flash varlen: {reason}", stacklevel=2
        )
    kernel = segment_attention if reason else flash_attention
    return kernel(query[0], key[0], value[0], segments, scale).transpose(0, 1)[None].contiguous()


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    segments: Segments | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature; `segments` comes from the model call's keywords."""
    if segments is None:
        raise RuntimeError(
            "or1_varlen attention needs the packing's segments: model(..., segments=window.segments)"
        )
    if kwargs.get("sliding_window") or (dropout and module.training):
        raise NotImplementedError("packed attention implements neither sliding windows nor attention dropout")
    return attend(query, key, value, segments, scaling), None


def enable(model: PreTrainedModel) -> None:
    """Make `model`'s attention layers attend over the segments passed to each forward (idempotent)."""
    AttentionInterface.register(ATTENTION, attention)
    model.set_attn_implementation(ATTENTION)
