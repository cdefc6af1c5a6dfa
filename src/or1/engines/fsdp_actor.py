"""The policy's training engine: a causal LM under FSDP2 (the actor, or the frozen reference policy).

Log-probs and full-vocabulary entropy of the sampled responses, and the PPO-clip update (the loss by name from
`algos.losses`); sharding, micro-batches, the update loop and checkpoints are `fsdp.FSDPEngine`'s.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed as dist

from or1.algos.aggregation import masked_mean
from or1.algos.losses import LossConfig, entropy_from_logits, policy_loss, token_log_probs
from or1.algos.rollout_correction import importance_weights
from or1.engines.fsdp import FSDPEngine
from or1.engines.fused_head import fused_head
from or1.engines.loading import load_causal_lm
from or1.engines.train_settings import DTYPES, TrainSettings
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ADVANTAGES,
    ENTROPY,
    IS_WEIGHTS,
    LOG_PROBS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    ROLLOUT_LOG_PROBS,
)

# The fused head asks for the hidden states; the first (the embeddings' output) is a view under packed rows, which
# FSDP2 warns of in case it is changed in place. or1 only reads the last one.
warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(\w+\) returned a view tensor")


class FSDPPolicyEngine(FSDPEngine):
    """The policy (actor, or the frozen reference when trainable=False): a causal LM under FSDP2."""

    def __init__(self, model_path: str | Path, settings: TrainSettings, *, trainable: bool = True):
        super().__init__(
            load_causal_lm(model_path, dtype=DTYPES[settings.dtype]), settings, trainable=trainable
        )
        self.on_policy_log_probs: torch.Tensor | None = None  # the last on-policy train_step's old log-probs

    def _forward(
        self,
        micro: dict[str, torch.Tensor],
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool = True,
    ):
        """Log-probs (and entropy, without its graph unless entropy_grad) [b, R] of one micro-batch's responses."""
        window = self._window(micro)
        fused = self.settings.fused_head

        def per_token(outputs: torch.Tensor, next_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
            log_probs, entropy = self._head(outputs, next_tokens, temperature, with_entropy, entropy_grad)
            return {LOG_PROBS: log_probs} | ({ENTROPY: entropy} if entropy is not None else {})

        if self.sp_group is not None:  # every position's outputs on this rank's slice, gathered, then picked
            outs = {
                k: window.picked(v)
                for k, v in self._sequence_parallel_forward(window, per_token, fused).items()
            }
        elif fused:  # the last hidden states of the kept positions; the head runs in chunks inside per_token
            out = self.model(**window.inputs, use_cache=False, logits_to_keep=1, output_hidden_states=True)
            outs = per_token(window.picked(out.hidden_states[-1]), window.targets)
        else:
            out = self.model(**window.inputs, use_cache=False, logits_to_keep=window.logits_to_keep)
            outs = per_token(window.kept(out.logits), window.targets)
        entropy = outs.get(ENTROPY)
        return window.scatter(outs[LOG_PROBS]), window.scatter(entropy) if entropy is not None else None

    def _head(
        self,
        outputs: torch.Tensor,
        targets: torch.Tensor,
        temperature: float,
        with_entropy: bool,
        entropy_grad: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs and entropy from the model's logits, or (fused head) from its last hidden states."""
        if self.settings.fused_head:
            return fused_head(
                outputs,
                self.model.get_output_embeddings().weight,  # the root's: left unsharded after its forward
                targets,
                temperature,
                chunk=self.settings.head_chunk_tokens,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                head_dtype=DTYPES[self.settings.head_dtype] if self.settings.head_dtype else None,
            )
        log_probs = token_log_probs(outputs, targets, temperature)
        if not with_entropy:
            return log_probs, None
        return log_probs, entropy_from_logits(outputs if entropy_grad else outputs.detach(), temperature)

    def log_probs(self, batch: Batch, *, temperature: float, with_entropy: bool = False) -> Batch:
        """Per-token log-probs (key `log_probs`) and optionally full-vocabulary entropy (`entropy`), [B, R]."""

        def forward(micro: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            log_probs, entropy = self._forward(micro, temperature, with_entropy)
            return {LOG_PROBS: log_probs} | ({ENTROPY: entropy} if entropy is not None else {})

        return self._inference(batch, forward)

    def train_step(
        self, batch: Batch, loss_cfg: LossConfig, *, temperature: float, entropy_coef: float = 0.0
    ) -> dict[str, float]:
        """One PPO-clip update (see `FSDPEngine._update`); the entropy term only when entropy_coef is non-zero.

        Without an `old_log_probs` column the update is on-policy (one mini-batch, one epoch): the old log-probs
        are this forward's own, detached, which is what a separate pass with the same weights would give; the
        full-vocabulary `entropy` metric is then computed here in its place. The metric `sampled_entropy` is the
        mean negative log-prob of the loss tokens under the weights before the step (the entropy controller's e_k).
        On-policy, those old log-probs [B, R] are kept in `on_policy_log_probs` (the sampler-mismatch metrics read
        them). A `rollout_is_weights` column multiplies each token's policy-gradient loss; on-policy with
        `loss_cfg.correction`'s importance sampling on, the weights come from this forward and a `rollout_log_probs`
        column instead (`rollout_correction.importance_weights`: what `correct` gives from a separate pass).
        """
        on_policy = OLD_LOG_PROBS not in batch.tensors
        if on_policy and (self.settings.mini_batches, self.settings.epochs) != (1, 1):
            raise ValueError(
                "train_step without old_log_probs needs one mini-batch and one epoch (an on-policy update)"
            )
        weigh = on_policy and loss_cfg.correction.is_level != "off"
        if on_policy and loss_cfg.correction.rejection != "off":
            raise ValueError(
                "an on-policy update cannot reject tokens: rejection needs the old log-probs first"
            )
        # the full-vocabulary entropy costs a pass over the logits; its graph only when it is in the loss
        need_entropy = entropy_coef != 0.0 or on_policy
        old_parts: list[torch.Tensor] = []

        def micro_loss(micro: dict[str, torch.Tensor], num_tokens: float, num_seqs: float):
            log_probs, entropy = self._forward(micro, temperature, need_entropy, entropy_coef != 0.0)
            current = log_probs.detach()
            if on_policy:
                old_parts.append(current.cpu())
            is_weights = micro.get(IS_WEIGHTS)
            if weigh:
                is_weights = importance_weights(
                    current, micro[ROLLOUT_LOG_PROBS], micro[RESPONSE_MASK], loss_cfg.correction
                )
            loss, metrics = policy_loss(
                log_probs,
                current if on_policy else micro[OLD_LOG_PROBS],
                micro[ADVANTAGES],
                micro[RESPONSE_MASK],
                loss_cfg,
                entropy=entropy,
                entropy_coef=entropy_coef,
                ref_log_probs=micro.get(REF_LOG_PROBS),
                is_weights=is_weights,
                num_tokens=num_tokens,
                num_seqs=num_seqs,
            )
            metrics["sampled_entropy"] = masked_mean(-current, micro[RESPONSE_MASK])
            return loss, metrics

        metrics = self._update(batch.tensors, micro_loss)
        if on_policy:  # one mini-batch: its micro-batches in row order, padding micro-batches last
            self.on_policy_log_probs = self._own_rows(torch.cat(old_parts), len(batch))
        return metrics

    def _own_rows(self, pooled: torch.Tensor, rows: int) -> torch.Tensor:
        """This rank's `rows` of outputs computed over its SP group's pooled rows (all of them without SP)."""
        if self.sp_group is None:
            return pooled[:rows]
        sizes: list[int | None] = [None] * self.sp
        dist.all_gather_object(sizes, rows, group=self.sp_group)
        start = sum(sizes[: dist.get_rank(self.sp_group)])
        return pooled[start : start + rows]
