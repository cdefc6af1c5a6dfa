"""What an FSDP2 engine needs from the recipe (`TrainSettings`), and the FSDP2 policies those settings ask for.

On CUDA (`TrainSettings.from_config` with a cuda device): parameters are kept in float32 and FSDP2's
MixedPrecisionPolicy computes in model.dtype (bfloat16) with float32 gradient reduction; `actor.offload` moves the
sharded parameters and optimizer state to host memory between phases; `actor.fsdp_cpu_offload` keeps them on the
host all the time (FSDP2's CPUOffloadPolicy: the optimizer steps on the CPU). On the CPU everything is float32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

if TYPE_CHECKING:
    from or1.config.schema import ActorConfig, CriticConfig, RunConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TrainSettings:
    """What an engine needs from the recipe (actor.* or critic.*, and model.*), in one typed place."""

    dtype: str = "float32"  # parameter (and optimizer state) dtype
    device: str = "cpu"
    mixed_precision: str | None = None  # FSDP2 compute dtype (CUDA only); gradients are reduced in float32
    offload: bool = False  # move parameters and optimizer state to the host between phases (CUDA)
    fsdp_cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy: keep them on the host all the time (CUDA)
    gradient_checkpointing: bool = False
    activation_offload: bool = False  # the checkpointed blocks' inputs in host memory (activation_offload.py)
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_size: int = 8  # sequences per forward / backward
    max_tokens_per_micro_batch: int | None = None  # micro-batches by token budget instead of micro_batch_size
    remove_padding: bool = False  # pack each micro-batch's sequences end to end into one row (no pad tokens)
    mini_batches: int = 1  # optimizer steps per pass over a batch (batch_size / ppo_mini_batch_size)
    epochs: int = 1  # passes over each batch
    sequence_parallel_size: int = 1  # ranks that split each packed micro-batch's tokens (Ulysses)
    fused_head: bool = (
        False  # the policy's head fused with its log-probs and entropy, in chunks (fused_head.py)
    )
    head_chunk_tokens: int | None = None  # None: the losses' slice size for the vocabulary
    head_dtype: str | None = None  # the fused head's matmul dtype; None: the compute dtype

    @classmethod
    def from_config(
        cls, cfg: RunConfig, section: ActorConfig | CriticConfig | None = None, device: str = "cpu"
    ) -> TrainSettings:
        """Settings of the actor (default) or of the optimiser section given (cfg.critic) on `device` (the rank's
        resolved device: "cpu" or "cuda[:i]").

        CPU: everything in float32 (CPU kernels want it), no offload. CUDA: float32 parameters with model.dtype as
        the mixed-precision compute dtype, and the section's offload settings (the actor's; the critic has none).
        """
        actor = section if section is not None else cfg.actor
        # the critic's None means the actor's mini-batch size
        mini_batch = actor.ppo_mini_batch_size or cfg.actor.ppo_mini_batch_size
        on_gpu = torch.device(device).type == "cuda"
        mixed = cfg.model.dtype if on_gpu and cfg.model.dtype != "float32" else None
        return cls(
            dtype="float32",
            device=device,
            mixed_precision=mixed,
            offload=on_gpu and getattr(actor, "offload", False),
            fsdp_cpu_offload=on_gpu and getattr(actor, "fsdp_cpu_offload", False),
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            activation_offload=getattr(actor, "activation_offload", False),
            lr=actor.lr,
            betas=tuple(actor.betas),
            weight_decay=actor.weight_decay,
            warmup_steps=actor.warmup_steps,
            grad_clip=actor.grad_clip,
            micro_batch_size=actor.micro_batch_size,
            max_tokens_per_micro_batch=actor.max_tokens_per_micro_batch,
            remove_padding=actor.remove_padding,
            mini_batches=max(1, cfg.trainer.batch_size // mini_batch),
            epochs=actor.ppo_epochs,
            sequence_parallel_size=actor.sequence_parallel_size,
            fused_head=getattr(actor, "fused_head", False),
            head_chunk_tokens=getattr(actor, "head_chunk_tokens", None),
            head_dtype="float32" if getattr(actor, "head_dtype", "model") == "float32" else None,
        )

    @property
    def compute_dtype(self) -> str:
        """The dtype the forward passes run in (the rollout engine's dtype too)."""
        return self.mixed_precision or self.dtype


def fsdp_policies(settings: TrainSettings) -> dict[str, object]:
    """fully_shard's mixed-precision and offload policies for these settings (empty on CPU: plain float32)."""
    policies: dict[str, object] = {}
    if settings.mixed_precision:
        policies["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=DTYPES[settings.mixed_precision], reduce_dtype=torch.float32
        )
    if settings.fsdp_cpu_offload:
        policies["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    return policies
