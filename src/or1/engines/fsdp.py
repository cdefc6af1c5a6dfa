"""The training engine: a Hugging Face causal LM sharded with FSDP2, its AdamW optimiser, and the passes RL needs.

One engine lives in every data-parallel rank (an ActorRolloutRef worker). `torch.distributed` must already be
initialised (gloo on CPU, nccl on GPU); every method that touches the model is collective: all ranks call it with
shards of equal size (DP_COMPUTE dispatch guarantees that, and the engine pads the micro-batch count anyway).

Batch layout (tensors, first dim = sequences): `input_ids` / `attention_mask` [B, P + R] with left-padded prompts
and right-padded responses, `responses` / `response_mask` [B, R] (the last R columns of input_ids; response_mask
is the loss mask), plus `old_log_probs`, `advantages` (and `ref_log_probs`) [B, R] for training. Each micro-batch
is cut to its own longest row before the forward pass, so compute is paid only for real tokens of kept rows.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from or1.algos.losses import LossConfig, entropy_from_logits, loss_denominators, policy_loss, token_log_probs
from or1.hybrid.batch import Batch
from or1.models.loading import load_causal_lm

if TYPE_CHECKING:
    from or1.config.schema import RunConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class TrainSettings:
    """What the engine needs from the recipe (actor.* and model.*), in one typed place."""

    dtype: str = "float32"
    gradient_checkpointing: bool = False
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_size: int = 8  # sequences per forward / backward
    mini_batches: int = 1  # optimizer steps per pass over a batch (batch_size / ppo_mini_batch_size)
    epochs: int = 1  # passes over each batch

    @classmethod
    def from_config(cls, cfg: RunConfig) -> TrainSettings:
        actor = cfg.actor
        dtype = "float32" if cfg.trainer.device == "cpu" else cfg.model.dtype  # CPU kernels want float32
        return cls(
            dtype=dtype,
            gradient_checkpointing=cfg.model.gradient_checkpointing,
            lr=actor.lr,
            betas=tuple(actor.betas),
            weight_decay=actor.weight_decay,
            warmup_steps=actor.warmup_steps,
            grad_clip=actor.grad_clip,
            micro_batch_size=actor.micro_batch_size,
            mini_batches=max(1, cfg.trainer.batch_size // actor.ppo_mini_batch_size),
            epochs=actor.ppo_epochs,
        )


class FSDPTrainEngine:
    """A causal LM under FSDP2 (each decoder layer and the root sharded) with AdamW and a warm-up schedule."""

    def __init__(
        self, model_path: str | Path, settings: TrainSettings, *, trainable: bool = True, device: str = "cpu"
    ):
        if not dist.is_initialized():
            raise RuntimeError(
                "FSDPTrainEngine needs torch.distributed initialised (Worker.init_distributed)"
            )
        self.settings = settings
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        model = load_causal_lm(model_path, dtype=DTYPES[settings.dtype]).to(device)
        self.config = model.config
        self.generation_config = model.generation_config
        # Aliases of tied weights (lm_head.weight when embeddings are tied): left out of saved checkpoints.
        unique = {name for name, _ in model.named_parameters()}
        self.tied_aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)} - unique
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
        self.model = model
        self.model.train(trainable)
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if trainable:
            self.optimizer = torch.optim.AdamW(
                model.parameters(), lr=settings.lr, betas=settings.betas, weight_decay=settings.weight_decay
            )
            warmup = settings.warmup_steps
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup else 1.0
            )

    # ---- forward passes -------------------------------------------------------------------------------------
    def _forward(self, micro: dict[str, torch.Tensor], temperature: float, with_entropy: bool):
        """Log-probs (and entropy) [b, R] of the responses of one micro-batch, computed on its trimmed window."""
        ids, mask = micro["input_ids"], micro["attention_mask"]
        width = micro["responses"].shape[1]
        prompt_width = ids.shape[1] - width
        keep_resp = max(1, int(mask[:, prompt_width:].sum(-1).max()))  # longest response in this micro-batch
        first = int(prompt_width - mask[:, :prompt_width].sum(-1).max())  # longest prompt's first column
        end = prompt_width + keep_resp
        ids, mask = ids[:, first:end], mask[:, first:end]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=keep_resp + 1,
        ).logits[
            :, :-1
        ]  # position t predicts token t + 1: the last R' + 1 positions predict the R' responses
        targets = micro["responses"][:, :keep_resp]
        real = mask[:, -keep_resp:].to(logits.dtype)  # 0 on the padding of rows shorter than the longest
        log_probs = _pad_right(token_log_probs(logits, targets, temperature) * real, width)
        entropy = _pad_right(entropy_from_logits(logits, temperature) * real, width) if with_entropy else None
        return log_probs, entropy

    @torch.no_grad()
    def log_probs(self, batch: Batch, *, temperature: float, with_entropy: bool = False) -> Batch:
        """Per-token log-probs (key `log_probs`) and optionally full-vocabulary entropy (`entropy`), [B, R]."""
        was_training = self.model.training
        self.model.eval()
        outs: dict[str, list[torch.Tensor]] = {"log_probs": [], "entropy": []}
        try:
            for rows in self._micro_slices(batch.tensors["input_ids"].shape[0]):
                micro = _take(batch.tensors, rows)
                log_probs, entropy = self._forward(micro, temperature, with_entropy)
                if rows.stop > rows.start:  # a padding micro-batch only keeps the collectives aligned
                    outs["log_probs"].append(log_probs)
                    if entropy is not None:
                        outs["entropy"].append(entropy)
        finally:
            self.model.train(was_training)
        return Batch(tensors={k: torch.cat(v) for k, v in outs.items() if v})

    # ---- training ----------------------------------------------------------------------------------------------
    def train_step(
        self, batch: Batch, loss_cfg: LossConfig, *, temperature: float, entropy_coef: float = 0.0
    ) -> dict[str, float]:
        """PPO epochs x mini-batches x micro-batches with gradient accumulation; one optimizer step per mini-batch.

        The loss of each mini-batch is normalised by its GLOBAL token (or sequence) count across all ranks, so the
        update is the same whatever the world size and micro-batch size. Returns metrics averaged over all ranks.
        """
        assert self.optimizer is not None and self.scheduler is not None, "a reference engine does not train"
        tensors = batch.tensors
        rows = tensors["input_ids"].shape[0]
        need_entropy = (
            entropy_coef != 0.0
        )  # the full-vocabulary entropy costs a pass over the logits: only if used
        sums: dict[str, float] = {}
        steps = 0
        self.model.train()
        for _ in range(self.settings.epochs):
            for mini in _even_slices(rows, self.settings.mini_batches):
                mini_tensors = _take(tensors, mini)
                tokens, seqs = self._global_counts(mini_tensors["response_mask"])
                for metrics in self._accumulate(
                    mini_tensors, loss_cfg, temperature, entropy_coef, need_entropy, tokens, seqs
                ):
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + value
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._optimizer_step()
                steps += 1
        return self._reduce_metrics(sums, steps)

    def _accumulate(
        self, mini, loss_cfg, temperature, entropy_coef, need_entropy, tokens, seqs
    ) -> Iterator[dict]:
        """Forward / backward every micro-batch of one mini-batch; yields token-weighted metric sums."""
        slices = self._micro_slices(mini["input_ids"].shape[0])
        for i, rows in enumerate(slices):
            micro = _take(mini, rows)
            self.model.set_requires_gradient_sync(
                i == len(slices) - 1
            )  # reduce gradients once per mini-batch
            log_probs, entropy = self._forward(micro, temperature, need_entropy)
            loss, metrics = policy_loss(
                log_probs,
                micro["old_log_probs"],
                micro["advantages"],
                micro["response_mask"],
                loss_cfg,
                entropy=entropy,
                entropy_coef=entropy_coef,
                ref_log_probs=micro.get("ref_log_probs"),
                num_tokens=tokens / self.world_size,
                num_seqs=seqs / self.world_size,  # FSDP averages over ranks
            )
            weight = 1.0 if rows.stop > rows.start else 0.0  # a padding micro-batch must not move the weights
            (loss * weight).backward()
            if weight:
                yield _weighted(metrics)

    def _optimizer_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    def _global_counts(self, mask: torch.Tensor) -> tuple[float, float]:
        """Loss tokens and sequences of a mini-batch summed over all ranks (the loss denominators)."""
        counts = torch.tensor(loss_denominators(mask), dtype=torch.float64)
        dist.all_reduce(counts)
        return float(counts[0]), float(counts[1])

    def _micro_slices(self, rows: int) -> list[slice]:
        """Micro-batch row ranges, padded with empty ranges so every rank runs the same number of passes."""
        size = self.settings.micro_batch_size
        slices = [slice(i, min(i + size, rows)) for i in range(0, rows, size)]
        count = torch.tensor([len(slices)])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return slices + [slice(0, 0)] * (int(count) - len(slices))

    def _reduce_metrics(self, sums: dict[str, float], steps: int) -> dict[str, float]:
        """Global metrics: token-weighted means of the loss statistics, sums of loss contributions, mean grad norm."""
        names: list[list[str]] = [[] for _ in range(self.world_size)]
        dist.all_gather_object(names, sorted(sums))  # every rank must reduce the same vector
        keys = sorted({k for rank_keys in names for k in rank_keys})
        values = torch.tensor([sums.get(k, 0.0) for k in keys], dtype=torch.float64)
        dist.all_reduce(values)
        total = dict(zip(keys, values.tolist(), strict=True))
        tokens = max(total.pop("tokens", 0.0), 1.0)
        out = {}
        for key, value in total.items():
            if key.endswith("_loss"):  # each rank's contributions add up to the batch loss x world size
                out[key] = value / self.world_size / max(steps, 1)
            elif key == "grad_norm":
                out[key] = value / self.world_size / max(steps, 1)
            else:
                out[key] = value / tokens
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    # ---- weights, checkpoints ----------------------------------------------------------------------------------
    def named_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter unsharded, one at a time (collective: all ranks must drain the iterator)."""
        for name, param in self.model.named_parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            yield name, full.detach()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model on CPU in HF naming, on rank 0 only (empty elsewhere); collective."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = get_model_state_dict(self.model, options=options)
        return {k: _own_storage(v) for k, v in state.items() if k not in self.tied_aliases}

    def save(self, folder: Path, *, with_optimizer: bool = True) -> None:
        """Rank 0 writes an HF model folder (config + safetensors) and the full optimizer state; collective."""
        from huggingface_hub import save_torch_state_dict

        state = self.full_state_dict()
        optim = None
        if with_optimizer and self.optimizer is not None:
            options = StateDictOptions(full_state_dict=True, cpu_offload=True)
            optim = get_optimizer_state_dict(self.model, self.optimizer, options=options)
        if self.rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            save_torch_state_dict(state, folder)
            self.config.save_pretrained(folder)
            if self.generation_config is not None:
                self.generation_config.save_pretrained(folder)
            if optim is not None:
                torch.save(
                    {"optimizer": optim, "scheduler": self.scheduler.state_dict()}, folder / OPTIMIZER_FILE
                )

    def load(self, folder: Path) -> None:
        """Load model weights (and optimizer state when saved) written by `save`; world-size independent."""
        from safetensors.torch import load_file

        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        state: dict[str, torch.Tensor] = {}
        saved: dict = {}
        if self.rank == 0:
            for file in sorted(folder.glob("*.safetensors")):
                state.update(load_file(file))
            if (folder / OPTIMIZER_FILE).is_file() and self.optimizer is not None:
                saved = torch.load(folder / OPTIMIZER_FILE, weights_only=False)
        # strict=False: tied aliases (lm_head.weight) are not in the file; the loaded embedding covers them
        model_options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
        result = set_model_state_dict(self.model, state, options=model_options)
        missing = set(getattr(result, "missing_keys", [])) - self.tied_aliases
        if self.rank == 0 and missing:
            raise ValueError(f"{folder}: checkpoint lacks {sorted(missing)[:5]}")
        if self.optimizer is None:
            return
        flag = torch.tensor([1 if saved else 0])
        dist.broadcast(flag, 0)
        if not int(flag):
            return
        set_optimizer_state_dict(self.model, self.optimizer, saved.get("optimizer", {}), options=options)
        holder = [saved.get("scheduler")]
        dist.broadcast_object_list(holder, 0)
        self.scheduler.load_state_dict(holder[0])

    def offload(self, params: bool = True, optimizer: bool = True) -> None:
        """No-op on CPU (parameters and optimizer state already live in host memory); the GPU engine moves them."""


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (model.model.layers for Llama / Qwen families)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)


def _take(tensors: dict[str, torch.Tensor], rows: slice) -> dict[str, torch.Tensor]:
    """The rows of every tensor; an empty slice stands for one dummy row (a padding micro-batch)."""
    if rows.stop <= rows.start:
        rows = slice(0, 1)
    return {k: v[rows] for k, v in tensors.items()}


def _even_slices(rows: int, parts: int) -> list[slice]:
    """`parts` contiguous ranges covering `rows` as evenly as possible (fewer when rows < parts)."""
    parts = max(1, min(parts, rows))
    size = math.ceil(rows / parts)
    return [slice(i, min(i + size, rows)) for i in range(0, rows, size)]


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes (safetensors refuses views into larger gathered buffers)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _pad_right(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.nn.functional.pad(values, (0, width - values.shape[1]))


def _weighted(metrics: dict[str, float]) -> dict[str, float]:
    """Loss contributions stay sums; local means become token-weighted sums (divided by total tokens later)."""
    tokens = metrics["tokens"]
    return {k: (v if k.endswith("_loss") or k == "tokens" else v * tokens) for k, v in metrics.items()}
