"""The output head fused with the per-token log-prob and entropy: no [T, V] logits tensor beyond one chunk of tokens.

At 32K responses the logits dominate a step's memory (or1-7b's 35,816 tokens x 152,064 entries are 10.1 GiB in bf16,
held for the loss and again as their gradient). Here each chunk of `chunk` positions goes through the head, the
log-prob of its sampled token and its entropy are taken (the same `token_log_probs` / `entropy_from_logits` as the
unfused path, so the numbers are the same), and the chunk's logits are dropped; the backward recomputes them, one
chunk at a time (a non-reentrant checkpoint per chunk: it keeps the chunk's hidden states, which exist anyway, and
the head's weight by reference). Recomputing costs one more head matmul per token in the backward (the head is ~4%
of a 7B's FLOPs); computing the chunk's gradients in the forward instead (Liger's fused linear cross-entropy) would
save it but needs the loss's per-token gradient before the forward ends, which PPO's clipped, importance-weighted,
aggregated loss does not give: recomputing keeps the loss code unchanged.

`head_dtype` float32 computes the logits from float32 copies of the chunk's hidden states and of the weight (the
log-probs the importance ratios compare, without bf16 rounding of the logits); None keeps the weight's dtype.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from or1.algos.losses import MAX_SLICE_ELEMENTS, entropy_from_logits, token_log_probs


def fused_head(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    *,
    chunk: int | None,
    with_entropy: bool,
    entropy_grad: bool = True,
    head_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `targets` [..., T] (and the full-vocabulary entropy, with its graph only when entropy_grad) at
    each position of `hidden` [..., T, H] under the head `weight` [V, H] (no bias) at `temperature`, float32.
    `chunk` None: as many positions as the losses' own slices hold (`MAX_SLICE_ELEMENTS` / V: 441 for 152,064)."""
    chunk = chunk or max(1, MAX_SLICE_ELEMENTS // weight.shape[0])
    if chunk < 1:
        raise ValueError(f"the head's chunk must be at least 1 token, got {chunk}")
    lead = hidden.shape[:-1]
    flat, flat_targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)

    def one_chunk(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if head_dtype is not None:
            h, w = h.to(head_dtype), w.to(head_dtype)
        logits = torch.nn.functional.linear(h, w)[None]  # [1, chunk, V]: the losses' [B, T, V] layout
        # in one slice (the chunk is already the slice): no second checkpoint inside this one
        log_probs = token_log_probs(logits, t[None], temperature, chunk=len(t))[0]
        if not with_entropy:
            return (log_probs,)
        lg = logits if entropy_grad else logits.detach()
        return log_probs, entropy_from_logits(lg, temperature, chunk=len(t))[0]

    parts = [
        checkpoint(
            one_chunk,
            flat[start : start + chunk],
            weight,
            flat_targets[start : start + chunk],
            use_reentrant=False,
            preserve_rng_state=False,  # the head draws no random numbers
        )
        for start in range(0, flat.shape[0], chunk)
    ]
    if not parts:  # no positions: empty outputs of the right shape
        empty = hidden.new_zeros(lead, dtype=torch.float32)
        return empty, empty.clone() if with_entropy else None
    log_probs = torch.cat([p[0] for p in parts]).reshape(lead)
    entropy = torch.cat([p[1] for p in parts]).reshape(lead) if with_entropy else None
    return log_probs, entropy
