"""Ulysses sequence parallelism: one packed sequence split over the ranks of a group, all-to-all inside attention.

Each of the `sp` ranks of a sequence-parallel group holds T / sp consecutive tokens of the same packed batch
(sequences laid end to end in one row, position ids restarting at 0 for each). Everything outside attention is
per token, so it runs on the local slice as it is. Attention needs the whole sequence: an all-to-all turns the
local [heads, T / sp] queries, keys and values into [heads / sp, T] (each rank gets every token for its share of
the heads), attention runs inside each packed sequence from the whole row's boundaries (`varlen.attend`, no mask),
and the inverse all-to-all brings the result back to [heads, T / sp]. Per-token outputs (log-probs, values) are
computed on the local slice and gathered, so the loss every rank sees is the loss of the whole group.

The attention function is registered with transformers as `or1_ulysses` (`enable` points a model at it); each
forward pass names the group and the whole row's segments in its keywords (`sp_group`, `segments`). A group of None
(or of one rank) is plain packed attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AttentionInterface, PretrainedConfig, PreTrainedModel

from or1.engines import varlen
from or1.engines.varlen import Segments
from or1.errors import UserError

ATTENTION = "or1_ulysses"


def check_heads(config: PretrainedConfig, sp: int) -> None:
    """Refuse a sequence-parallel size that the model's attention heads cannot be split over."""
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % sp:
        raise UserError(
            f"sequence_parallel_size {sp} does not divide the model's {heads} attention heads; pick a divisor"
        )
    if kv_heads % sp and sp % kv_heads:
        raise UserError(
            f"sequence_parallel_size {sp} and the model's {kv_heads} key/value heads: one must divide the other"
        )


def enable(model: PreTrainedModel) -> None:
    """Make `model`'s attention layers call the Ulysses attention (idempotent)."""
    if "sliding_attention" in (getattr(model.config, "layer_types", None) or []):
        raise UserError("sequence parallelism does not support sliding-window attention layers; use size 1")
    AttentionInterface.register(ATTENTION, attention)
    model.set_attn_implementation(ATTENTION)


def group_size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    segments: Segments | None = None,
    sp_group: dist.ProcessGroup | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention interface: q [1, H, T/sp, d], k / v [1, KV, T/sp, d] -> out [1, T/sp, H, d];
    `segments` are the whole (padded) row's. Between the all-to-alls it is the packed attention itself
    (`varlen.attention`, which refuses what it does not implement)."""
    sp = group_size(sp_group)
    if sp > 1:
        kv_heads = key.shape[1]
        if kv_heads < sp:  # each rank needs a key/value head of its own: repeat them (GQA with few KV heads)
            key = key.repeat_interleave(sp // kv_heads, dim=1)
            value = value.repeat_interleave(sp // kv_heads, dim=1)
        query, key, value = (
            all_to_all(t, sp_group, scatter_dim=1, gather_dim=2) for t in (query, key, value)
        )
    out, _ = varlen.attention(  # [1, T, H / sp, d]
        module,
        query,
        key,
        value,
        attention_mask,
        dropout=dropout,
        scaling=scaling,
        segments=segments,
        **kwargs,
    )
    if sp > 1:  # back to this rank's tokens, every head
        out = all_to_all(out, sp_group, scatter_dim=1, gather_dim=2)
    return out, None


def _exchange(x: torch.Tensor, group: dist.ProcessGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """Rank r sends chunk j of `scatter_dim` to rank j and concatenates what it receives along `gather_dim`."""
    sp = dist.get_world_size(group)
    send = torch.stack(x.tensor_split(sp, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, scatter_dim, gather_dim):
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        return _exchange(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad.contiguous(), ctx.group, gather_dim, scatter_dim), None, None, None


def all_to_all(
    x: torch.Tensor, group: dist.ProcessGroup, *, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    """Differentiable all-to-all (its backward is the inverse exchange)."""
    return _AllToAll.apply(x, group, scatter_dim, gather_dim)


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, dim):
        ctx.group, ctx.dim = group, dim
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        # every rank computes the same loss from the gathered tensor: each one back-propagates its own slice
        rank, sp = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return grad.tensor_split(sp, dim=ctx.dim)[rank].contiguous(), None, None


def gather(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 1) -> torch.Tensor:
    """The group's slices of a per-token tensor concatenated in rank order along `dim` (differentiable).

    Backward keeps only this rank's slice of the gradient: meant for a loss that every rank of the group computes
    identically from the gathered tensor, so the group's gradient contributions add up to that loss's gradient.
    """
    if group_size(group) == 1:
        return x
    return _Gather.apply(x, group, dim)


def pad_to_multiple(
    ids: torch.Tensor, positions: torch.Tensor, segments: Segments, sp: int
) -> tuple[torch.Tensor, torch.Tensor, Segments]:
    """A packed row [1, T] padded to a multiple of `sp` tokens with a dummy sequence (its own positions from 0)."""
    pad = math.ceil(ids.shape[1] / sp) * sp - ids.shape[1]
    if not pad:
        return ids, positions, segments
    dummy = torch.arange(pad, device=ids.device)[None]
    ids = torch.cat([ids, torch.zeros_like(dummy)], 1)
    return ids, torch.cat([positions, dummy.to(positions.dtype)], 1), segments.then(pad)


def local_slice(x: torch.Tensor, group: dist.ProcessGroup | None, dim: int = 1) -> torch.Tensor:
    """This rank's consecutive share of a padded packed tensor along `dim`."""
    if group_size(group) == 1:
        return x
    return x.tensor_split(dist.get_world_size(group), dim=dim)[dist.get_rank(group)]


# (local logits [1, T/sp, V], the tokens they predict [1, T/sp]) -> per-token outputs [1, T/sp] by name
PerToken = Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


def packed_forward(
    model: PreTrainedModel,
    ids: torch.Tensor,
    positions: torch.Tensor,
    segments: Segments,
    group: dist.ProcessGroup | None,
    per_token: PerToken,
    *,
    hidden: bool = False,
) -> dict[str, torch.Tensor]:
    """A packed row (ids, positions [1, N], its segments) split over `group` through `model`; `per_token` runs on
    each rank's slice of the logits (with `hidden`: of the last hidden states, for a head of its own) and the tokens
    that follow, and its outputs come back gathered as [1, N] (the output at position t, which predicts token t + 1).
    Collective over the group; differentiable."""
    length = ids.shape[1]
    padded_ids, padded_positions, padded_segments = pad_to_multiple(
        ids, positions, segments, group_size(group)
    )
    next_tokens = F.pad(padded_ids[:, 1:], (0, 1))  # across a sequence's end: an output nobody reads
    out = model(
        input_ids=local_slice(padded_ids, group),
        position_ids=local_slice(padded_positions, group),
        segments=padded_segments,
        sp_group=group,
        use_cache=False,
        **({"logits_to_keep": 1, "output_hidden_states": True} if hidden else {}),
    )
    outs = per_token(out.hidden_states[-1] if hidden else out.logits, local_slice(next_tokens, group))
    return {key: gather(value, group)[:, :length] for key, value in outs.items()}
