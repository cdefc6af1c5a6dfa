"""Model FLOPs of a training update, from the architecture (`ModelShape`) and the sequences' lengths.

Counted as 2 FLOPs per multiply-add of the matmuls a token goes through, per forward pass:
- the decoder blocks' weights: query, key, value and output projections and the gated MLP's three matrices
  (biases, norms, rotary embeddings and activations are elementwise and left out, as is the input embedding, a
  lookup);
- causal attention inside each sequence (packed rows attend only within their own sequence): per layer and query
  head, query i scores keys 0..i and sums their values, head_dim multiply-adds each, so 2 x 2 x head_dim x
  L (L + 1) / 2 for a sequence of L tokens;
- the output head (hidden x vocab) only at the positions the engine asks logits for (`logits_to_keep`: one per
  response token).
A training pass is forward + backward = 3 x the forward (the backward computes the gradients of both the input and
the weight of every matmul). Activation checkpointing re-runs each block's forward in the backward, up to the last
tensor the backward needs (torch's non-reentrant checkpoint stops early: the MLP's down projection is not re-run):
`recompute` counts that too (hardware FLOPs); model FLOPs, and so MFU, leave it out as is conventional.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from or1.plan.model import ModelShape


@dataclass(frozen=True)
class ForwardFlops:
    """One forward pass's FLOPs by part."""

    blocks: float  # the decoder blocks' weight matmuls
    attention: float  # scores and weighted values, causal, per sequence
    head: float  # the output head at the positions whose logits are computed

    @property
    def total(self) -> float:
        return self.blocks + self.attention + self.head


def block_matmul_parameters(shape: ModelShape) -> int:
    """The weights of one decoder block that a token multiplies through (projections and MLP; no bias or norm)."""
    q, kv, h = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.hidden
    return h * q + 2 * h * kv + q * h + 3 * h * shape.intermediate


def forward_flops(shape: ModelShape, lengths: Sequence[int], logits: int) -> ForwardFlops:
    """A forward pass over sequences of `lengths` tokens (prompt + response each), with logits at `logits`
    positions in all."""
    tokens = sum(lengths)
    pairs = sum(n * (n + 1) // 2 for n in lengths)  # (query, key) pairs a causal attention computes
    return ForwardFlops(
        blocks=2.0 * shape.layers * block_matmul_parameters(shape) * tokens,
        attention=4.0 * shape.layers * shape.heads * shape.head_dim * pairs,
        head=2.0 * shape.hidden * shape.vocab * logits,
    )


def training_flops(
    shape: ModelShape, lengths: Sequence[int], logits: int, *, recompute: bool = False
) -> float:
    """Forward and backward over the sequences: 3 x the forward's model FLOPs; with `recompute` (activation
    checkpointing) also the blocks' forward again but their last matmul, attention included (the head is not
    checkpointed)."""
    forward = forward_flops(shape, lengths, logits)
    if not recompute:
        return 3.0 * forward.total
    rerun = 1.0 - shape.hidden * shape.intermediate / block_matmul_parameters(shape)  # all but down_proj
    return 3.0 * forward.total + rerun * forward.blocks + forward.attention
