"""Bytes of each thing a rank holds, from a model's shape: FSDP2 shards, saved activations, vLLM weights and KV cache.

Pure arithmetic, each term one line with the tensor it stands for, so a measurement can be held against it term by
term. The activation terms follow what autograd saves in a Hugging Face Llama / Qwen2 block (measured with
`torch.autograd.graph.saved_tensors_hooks` in tests/plan): each RMS norm keeps its float32 input, its normalised
output and the scaled output (compute dtype) and one float32 per token; attention keeps the queries, keys and
values its kernel is given, its output and a float32 log-sum-exp per head; the gated MLP keeps four
intermediate-wide tensors. With activation checkpointing a block keeps only its input. Packed rows attend from the
sequences' boundaries (`or1.engines.varlen`), with no mask; only a padded micro-batch carries one, a boolean
[rows, width, width] mask that transformers' sdpa reads in every block. The logits part follows `or1.algos.losses`: float32
copies of the kept positions' logits (one for the log-probs, three for an entropy term with a gradient), or, when
the logits are too large for one slice (`LOGIT_SLICE_ELEMENTS`), the compute-dtype logits themselves. With the fused
head (`or1.engines.fused_head`, `head_chunk` positions at a time) no logits are kept: the kept positions' hidden states
and targets are, and the transients are one chunk's logits and its float32 temporaries. The transients were counted
at the CPU allocator (the profiler's allocation events) for whole update and log-prob passes, which tests/plan holds
to the phases' sums within 10%.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from or1.plan.model import ModelShape, numel

GIB = 2**30
FLOAT32 = 4
INT64 = 8
# or1.algos.losses slices the logits along time so one float32 [rows, slice, vocab] temporary holds at most this many
# elements (kept equal to its MAX_SLICE_ELEMENTS; tests/plan checks they agree)
LOGIT_SLICE_ELEMENTS = 2**26
# float32 [slice, vocabulary] temporaries of the log-prob and entropy of one slice at the pass's peak, beside the
# logits (z, the clamped copy, the softmax, their product; in the backward the recomputed ones and their gradients),
# counted at the allocator on the CPU (the profiler's allocation events, tests/plan/test_memory.py)
SLICE_TEMPORARIES_FORWARD = 4
SLICE_TEMPORARIES_BACKWARD = 5
VOCAB_PADDING = (
    64  # vLLM pads the vocabulary to a multiple of this before splitting it over tensor-parallel ranks
)


# ---- FSDP2 ---------------------------------------------------------------------------------------------------------
def shard_bytes(shape: ModelShape, world: int, dtype_bytes: int = FLOAT32) -> int:
    """One rank's share of every parameter (FSDP2 splits dim 0 into `world` chunks; rank 0's is the largest)."""
    return sum(math.ceil(s[0] / world) * (numel(s) // s[0]) * dtype_bytes for s in shape.parameter_shapes())


@dataclass(frozen=True)
class ShardState:
    """What a training rank keeps between passes: float32 master parameters, their gradients, AdamW's two moments."""

    parameters: int
    gradients: int
    optimizer: int

    @classmethod
    def of(cls, shape: ModelShape, world: int) -> ShardState:
        params = shard_bytes(shape, world)
        return cls(parameters=params, gradients=params, optimizer=2 * params)


def gathered_bytes(shape: ModelShape, compute_bytes: int) -> int:
    """Unsharded parameters during a forward / backward: the root unit (embedding, head) stays gathered through the
    pass, plus a block being computed and the next one prefetched, plus one block's float32 gradients on their way to
    the reduce-scatter."""
    return (
        compute_bytes * (shape.root_parameters + 2 * shape.layer_parameters)
        + FLOAT32 * shape.layer_parameters
    )


# ---- activations ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Window:
    """One micro-batch as one rank's model sees it.

    tokens: positions through the decoder on this rank; logits: positions whose logits the head computes; scored:
    positions whose log-probs (and entropy) are computed; mask: elements of a padded micro-batch's boolean
    attention mask (rows x width^2), 0 for a packed row (its attention needs none).
    """

    tokens: int
    logits: int
    scored: int
    mask: int = 0


@dataclass(frozen=True)
class Activations:
    """Saved-for-backward bytes of one micro-batch, by part."""

    blocks: int
    logits: int
    other: int  # token ids, rotary tables, final norm, the head's input, a padded micro-batch's mask

    @property
    def total(self) -> int:
        return self.blocks + self.logits + self.other


def block_bytes_per_token(
    shape: ModelShape, compute_bytes: int, kv_saved_heads: int | None = None, extra_copy: bool = False
) -> int:
    """Saved bytes per token of one decoder block without checkpointing. `kv_saved_heads`: heads of the keys and
    values attention keeps (the model's key/value heads, or more where they are repeated for the kernel);
    `extra_copy`: the attention output is copied once more before the output projection (Ulysses's all-to-all; the
    CPU kernel's gather back to row order, `varlen.segment_attention`)."""
    c, h, q = compute_bytes, shape.hidden, shape.heads * shape.head_dim
    kv = (shape.kv_heads if kv_saved_heads is None else kv_saved_heads) * shape.head_dim
    norm = FLOAT32 * h + 2 * c * h + FLOAT32  # float32 input, normalised and scaled outputs, 1/rms
    attention = c * (q + 2 * kv + q + (q if extra_copy else 0)) + FLOAT32 * shape.heads  # q, k, v, out, lse
    mlp = 4 * c * shape.intermediate  # gate, silu(gate), up, their product
    return 2 * norm + attention + mlp


def logits_sliced(shape: ModelShape, window: Window) -> bool:
    """Whether or1.algos.losses slices these logits along time (then checkpointing each slice)."""
    return window.scored * shape.vocab > LOGIT_SLICE_ELEMENTS


def saved_activations(
    shape: ModelShape,
    window: Window,
    *,
    compute_bytes: int,
    checkpointing: bool,
    entropy_grad: bool,
    kv_saved_heads: int | None = None,
    extra_copy: bool = False,
    head_chunk: int | None = None,
    activation_offload: bool = False,
) -> Activations:
    """Bytes autograd keeps on the GPU from one micro-batch's forward until its backward (`head_chunk`: the fused
    head's; `activation_offload`: the checkpointed inputs on the host, `offloaded_inputs`)."""
    c, t = compute_bytes, window.tokens
    if checkpointing and activation_offload:
        blocks, mask = 0, window.mask  # the blocks' inputs wait on the host (backward_extra: two come back)
    elif checkpointing:
        blocks = shape.layers * t * shape.hidden * c  # each block's input, recomputed from in backward
        mask = window.mask  # a padded micro-batch's boolean mask, an input of every checkpointed block
    else:
        blocks = shape.layers * t * block_bytes_per_token(shape, c, kv_saved_heads, extra_copy)
        mask = shape.layers * window.mask * c  # sdpa turns that mask into an additive one per block
    head_input = window.logits * shape.hidden * c  # the head's input (the unfused head's kept positions)
    if head_chunk is not None:
        # the fused head keeps the scored positions' hidden states and targets, no logits; the model's own head
        # still runs on one position, and what it saves keeps the whole last hidden state alive
        logits, head_input = window.scored * (shape.hidden * c + INT64), t * shape.hidden * c
    elif logits_sliced(shape, window):
        logits = window.logits * shape.vocab * c  # held by the checkpointed slices
    else:
        lse = 1 + (1 if entropy_grad else 0)  # one float32 log-sum-exp per position and term
        logits = window.scored * FLOAT32 * (shape.vocab * saved_logit_copies(entropy_grad) + lse)
    other = (
        t * INT64  # token ids (the embedding's backward)
        + 2 * t * shape.head_dim * c  # rotary cos / sin
        + t * (FLOAT32 * shape.hidden + c * shape.hidden + FLOAT32)  # final norm
        + head_input
        + mask
    )
    return Activations(blocks=blocks, logits=logits, other=other)


def saved_logit_copies(entropy_grad: bool) -> int:
    """Float32 copies of the scored logits an unsliced loss saves: the log-prob's z; the entropy's z, finite z and
    softmax when its gradient is taken."""
    return 1 + (3 if entropy_grad else 0)


def fused_head_chunk(shape: ModelShape) -> int:
    """The fused head's default chunk: as many positions as one of the losses' float32 slices holds."""
    return max(1, LOGIT_SLICE_ELEMENTS // shape.vocab)


def offloaded_inputs(shape: ModelShape, window: Window, *, compute_bytes: int) -> int:
    """Host bytes of one micro-batch's checkpointed block inputs under actor.activation_offload."""
    return shape.layers * window.tokens * shape.hidden * compute_bytes


def _head_rows(shape: ModelShape, window: Window, head_chunk: int | None) -> tuple[int, int]:
    """Positions whose logits exist at once (every kept one, or one fused chunk), and one float32 slice's rows (the
    losses' slice, or the fused chunk: the head takes its log-probs and entropy in one slice)."""
    if head_chunk is not None:
        rows = min(head_chunk, window.scored)
        return rows, rows
    return window.logits, min(window.scored, max(1, LOGIT_SLICE_ELEMENTS // shape.vocab))


def backward_extra(
    shape: ModelShape,
    window: Window,
    *,
    compute_bytes: int,
    entropy_grad: bool,
    head_chunk: int | None = None,
    activation_offload: bool = False,
) -> int:
    """Transient bytes on top of the saved activations at the backward's peak: the logits' gradient (the fused head:
    one chunk's recomputed logits), one block's activations (recomputed under checkpointing, or its gradients in
    flight), a float32 logit slice's temporaries (less the copies an unsliced loss saved, which are among them; for
    sliced logits, or the next slice's gradient, which autograd widens to the whole logits before adding it, if that
    is larger), and under activation offload the inputs of the block being recomputed and of the next one, copied
    back ahead."""
    c = compute_bytes
    back = 2 * window.tokens * shape.hidden * c if activation_offload else 0
    rows, slice_rows = _head_rows(shape, window, head_chunk)
    slice_bytes = slice_rows * shape.vocab * FLOAT32
    temporaries = SLICE_TEMPORARIES_BACKWARD * slice_bytes
    if head_chunk is None and logits_sliced(shape, window):
        # each slice's gradient comes as a whole-logits tensor of zeros, added to the sum
        temporaries = max(temporaries, rows * shape.vocab * c)
    elif head_chunk is None:
        temporaries -= saved_logit_copies(entropy_grad) * slice_bytes  # saved by the forward, already counted
    return (
        rows * shape.vocab * c
        + window.tokens * block_bytes_per_token(shape, c)
        + window.mask * c  # that block's additive mask (padded)
        + temporaries
        + back
    )


def inference_bytes(
    shape: ModelShape, window: Window, *, compute_bytes: int, head_chunk: int | None = None
) -> int:
    """Peak transient bytes of a no-grad pass (old log-probs): the larger of one block's temporaries (bounded by
    what it would save for a backward) and the head's (the logits, the fused head: one chunk's, and a logit slice's
    temporaries), which come after the blocks' are freed; the last hidden states live through both."""
    c = compute_bytes
    rows, slice_rows = _head_rows(shape, window, head_chunk)
    head = rows * shape.vocab * c + SLICE_TEMPORARIES_FORWARD * slice_rows * shape.vocab * FLOAT32
    return (
        max(window.tokens * block_bytes_per_token(shape, c), head)
        + window.tokens * shape.hidden * c
        + window.mask * (1 + c)  # a padded micro-batch's boolean mask and one block's additive copy
    )


# ---- vLLM ----------------------------------------------------------------------------------------------------------
def kv_heads_per_rank(shape: ModelShape, tp: int) -> int:
    """vLLM splits key/value heads over tensor-parallel ranks and replicates them when there are fewer than ranks."""
    return max(1, shape.kv_heads // tp)


def kv_bytes_per_token(shape: ModelShape, tp: int, compute_bytes: int) -> int:
    """KV-cache bytes one token takes on one tensor-parallel rank: a key and a value per layer and local head."""
    return 2 * shape.layers * kv_heads_per_rank(shape, tp) * shape.head_dim * compute_bytes


def rollout_weight_bytes(shape: ModelShape, tp: int, compute_bytes: int) -> int:
    """One tensor-parallel rank's weights in vLLM: projections split over the ranks (key / value heads replicated
    when fewer than ranks), norms whole, the padded vocabulary split."""
    h, d, i = shape.hidden, shape.head_dim, shape.intermediate
    q = shape.heads * d // tp
    kv = kv_heads_per_rank(shape, tp) * d
    layer = 2 * q * h + 2 * kv * h + 3 * h * i // tp + 2 * h + ((q + 2 * kv) if shape.qkv_bias else 0)
    vocab = math.ceil(shape.vocab / VOCAB_PADDING) * VOCAB_PADDING // tp
    root = vocab * h * (1 if shape.tied else 2) + h
    return compute_bytes * (shape.layers * layer + root)


def rollout_workspace_bytes(
    shape: ModelShape, tp: int, compute_bytes: int, batched_tokens: int, sequences: int
) -> int:
    """vLLM's profiled activation peak (an estimate): a forward of `batched_tokens` tokens (hidden-wide and
    intermediate-wide temporaries) and the sampler's float32 logits and probabilities for `sequences` sequences."""
    forward = batched_tokens * (4 * shape.hidden + 2 * shape.intermediate // tp) * compute_bytes
    sampler = sequences * shape.vocab * FLOAT32 * 2
    return forward + sampler
