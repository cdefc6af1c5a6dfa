"""The training engines: Hugging Face models sharded with FSDP2, their AdamW optimisers, and the passes RL needs.

`FSDPTrainEngine` is the policy (a causal LM: log-probs, entropy, the PPO-clip update); `FSDPCriticEngine` is PPO's
critic (the same architecture with a value head: values, the clipped value update). One engine of each role lives
in every data-parallel rank (ActorRolloutRef and Critic workers, colocated). `torch.distributed` must already be
initialised (gloo on CPU; on GPU nccl for CUDA tensors and gloo for the CPU tensors of the bookkeeping collectives);
every method that touches the model is collective: all ranks call it with shards of equal size (DP_COMPUTE dispatch
guarantees that, and the engine pads the micro-batch count anyway).

Batch layout (tensors, first dim = sequences): `input_ids` / `attention_mask` [B, P + R] with left-padded prompts
and right-padded responses, `responses` / `response_mask` [B, R] (the last R columns of input_ids; response_mask
is the loss mask), plus `old_log_probs`, `advantages` (and `ref_log_probs`) [B, R] for the policy's update and
`values`, `returns` [B, R] for the critic's. Micro-batches hold `micro_batch_size` rows, or as many consecutive
rows as fit `max_tokens_per_micro_batch` tokens. With `remove_padding` a micro-batch's sequences are packed
end to end into as few rows as fit (`packing.pack_rows`; position ids restart at 0 per sequence and no attention mask, from
which transformers builds a mask that keeps attention inside each sequence), so almost no compute goes to pad
tokens; without it, the micro-batch is cut to its longest prompt and response and padded. Either way the outputs
come back in the [b, R] layout above. On the CPU, attention goes through `attention.grouped_sdpa`.

On CUDA (`TrainSettings.from_config` with a cuda device): parameters are kept in float32 and FSDP2's
MixedPrecisionPolicy computes in model.dtype (bfloat16) with float32 gradient reduction; `actor.offload` moves the
sharded parameters and optimizer state to host memory between phases (`offload` / `onload`, called by the worker
around the colocated rollout); `actor.fsdp_cpu_offload` keeps them on the host all the time (FSDP2's
CPUOffloadPolicy: the optimizer steps on the CPU). Micro-batches move to the device inside the passes and results
come back on the CPU.

Sequence parallelism (settings.sequence_parallel_size = sp > 1, see `ulysses`): the world is a (dp, sp) mesh whose
sp groups are consecutive ranks; FSDP still shards over all ranks. Each rank receives its own DP_COMPUTE share; the
ranks of a group pool their shares (mini-batch by mini-batch), every one of them runs the group's micro-batches,
each packed into one row and split token-wise over the group, and each returns the outputs of its own share.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
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
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from transformers import PreTrainedModel

from or1.algos.aggregation import loss_denominators, masked_mean
from or1.algos.losses import LossConfig, entropy_from_logits, policy_loss, token_log_probs, value_loss
from or1.engines import ulysses
from or1.engines.attention import use_grouped_sdpa
from or1.engines.loading import load_causal_lm, load_value_model
from or1.engines.packing import Window, even_slices, packed_window, padded_window, token_budget_slices
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ADVANTAGES,
    ATTENTION_MASK,
    ENTROPY,
    INPUT_IDS,
    IS_WEIGHTS,
    LOG_PROBS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    RESPONSE_MASK,
    RETURNS,
    VALUES,
)

if TYPE_CHECKING:
    from or1.config.schema import ActorConfig, CriticConfig, RunConfig

# The token-classification head's output trips FSDP2's warning about in-place ops on view outputs; the critic only
# slices its logits out of place.
warnings.filterwarnings(
    "ignore", message=r"FSDP2-wrapped module \(FSDP\w+ForTokenClassification\) returned a view"
)

# micro-batch tensors -> outputs [b, R] by name (an inference pass)
MicroForward = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
# (micro-batch tensors, global tokens / world size, global sequences / world size) -> (loss, metrics with `tokens`)
MicroLoss = Callable[[dict[str, torch.Tensor], float, float], tuple[torch.Tensor, dict[str, float]]]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
OPTIMIZER_FILE = "optimizer.pt"


@dataclass(frozen=True)
class TrainSettings:
    """What an engine needs from the recipe (actor.* or critic.*, and model.*), in one typed place."""

    dtype: str = "float32"  # parameter (and optimizer state) dtype
    device: str = "cpu"
    mixed_precision: str | None = None  # FSDP2 compute dtype (CUDA only); gradients are reduced in float32
    offload: bool = False  # move parameters and optimizer state to the host between phases (CUDA)
    fsdp_cpu_offload: bool = False  # FSDP2 CPUOffloadPolicy: keep them on the host all the time (CUDA)
    gradient_checkpointing: bool = False
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 1.0
    micro_batch_size: int = 8  # sequences per forward / backward
    max_tokens_per_micro_batch: int | None = None  # micro-batches by token budget instead of micro_batch_size
    remove_padding: bool = False  # pack each micro-batch's sequences end to end into rows (no pad tokens)
    mini_batches: int = 1  # optimizer steps per pass over a batch (batch_size / ppo_mini_batch_size)
    epochs: int = 1  # passes over each batch
    sequence_parallel_size: int = 1  # ranks that split each packed micro-batch's tokens (Ulysses)

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


class FSDPEngine:
    """An HF model under FSDP2 (each decoder layer and the root sharded) with AdamW and a warm-up schedule.

    The machinery the policy (FSDPTrainEngine) and the critic (FSDPCriticEngine) share: sharding, micro-batch
    windows, the epochs x mini-batches x micro-batches update loop with global loss denominators, metric reduction
    over ranks, and world-size independent checkpoints.
    """

    def __init__(self, model: PreTrainedModel, settings: TrainSettings, *, trainable: bool = True):
        if not dist.is_initialized():
            raise RuntimeError("FSDP engines need torch.distributed initialised (Worker.init_distributed)")
        self.settings = settings
        self.device = torch.device(settings.device)
        if self.device.type != "cuda" and (
            settings.mixed_precision or settings.offload or settings.fsdp_cpu_offload
        ):
            raise ValueError(
                "mixed precision and offload are CUDA settings; on the CPU everything is float32"
            )
        self.world_size = dist.get_world_size()
        self.rank = dist.get_rank()
        self.sp = settings.sequence_parallel_size
        self.sp_group = self._sequence_parallel_group(model)
        if self.device.type == "cpu":  # (Ulysses, when on, has set its own attention)
            use_grouped_sdpa(model)
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        # Aliases of tied weights (lm_head.weight when embeddings are tied): left out of saved checkpoints.
        unique = {name for name, _ in model.named_parameters()}
        self.tied_aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)} - unique
        if settings.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        shard: dict[str, object] = fsdp_policies(settings)
        if self.device.type == "cuda":
            # the model was loaded on the host: fully_shard moves each rank's shards to its GPU (or keeps them on
            # the host under CPUOffloadPolicy), so no rank ever holds the whole model in GPU memory
            shard["mesh"] = init_device_mesh("cuda", (self.world_size,))
        for layer in decoder_layers(model):
            fully_shard(layer, **shard)
        fully_shard(model, **shard)
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

    def _sequence_parallel_group(self, model: PreTrainedModel) -> dist.ProcessGroup | None:
        """This rank's SP group in a (dp, sp) mesh of consecutive ranks (None without SP); points the model's
        attention at Ulysses. Collective: every rank builds the whole mesh."""
        if self.sp == 1:
            return None
        if self.world_size % self.sp:
            raise UserError(
                f"sequence_parallel_size {self.sp} does not divide the world size {self.world_size}"
            )
        ulysses.check_heads(model.config, self.sp)
        ulysses.enable(model)
        mesh = init_device_mesh(
            self.device.type, (self.world_size // self.sp, self.sp), mesh_dim_names=("dp", "sp")
        )
        return mesh.get_group("sp")

    # ---- passes ------------------------------------------------------------------------------------------------
    def _window(self, micro: dict[str, torch.Tensor]) -> Window:
        """The model inputs of a micro-batch, packed or padded as the settings say (one packed row under SP)."""
        if self.sp_group is not None:
            return packed_window(micro, one_row=True)
        return packed_window(micro) if self.settings.remove_padding else padded_window(micro)

    def _sequence_parallel_forward(
        self, window: Window, per_token: ulysses.PerToken
    ) -> dict[str, torch.Tensor]:
        """Outputs [1, N] of every position of a packed window, through the Ulysses forward over this rank's group."""
        ids, positions = window.inputs["input_ids"], window.inputs["position_ids"]
        return ulysses.packed_forward(self.model, ids, positions, self.sp_group, per_token)

    def _group_share(self, tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], slice]:
        """The SP group's pooled rows (its ranks' shares in rank order) and this rank's rows within them."""
        if self.sp_group is None:
            return tensors, slice(0, tensors[INPUT_IDS].shape[0])
        shares: list[dict[str, torch.Tensor] | None] = [None] * self.sp
        dist.all_gather_object(shares, tensors, group=self.sp_group)
        sizes = [share[INPUT_IDS].shape[0] for share in shares]
        start = sum(sizes[: dist.get_rank(self.sp_group)])
        pooled = {key: torch.cat([share[key] for share in shares]) for key in tensors}
        return pooled, slice(start, start + tensors[INPUT_IDS].shape[0])

    @torch.no_grad()
    def _inference(self, batch: Batch, forward: MicroForward) -> Batch:
        """Run `forward` over every micro-batch in eval mode and concatenate its [b, R] outputs per key."""
        was_training = self.model.training
        self.model.eval()
        tensors, own = self._group_share(batch.tensors)
        outs: dict[str, list[torch.Tensor]] = {}
        try:
            for rows in self._micro_slices(tensors[ATTENTION_MASK]):
                result = forward(_take(tensors, rows, self.device))
                if rows.stop > rows.start:  # a padding micro-batch only keeps the collectives aligned
                    for key, value in result.items():
                        outs.setdefault(key, []).append(value.cpu())
        finally:
            self.model.train(was_training)
        return Batch(tensors={k: torch.cat(v)[own] for k, v in outs.items()})

    def _update(self, tensors: dict[str, torch.Tensor], micro_loss: MicroLoss) -> dict[str, float]:
        """PPO epochs x mini-batches x micro-batches with gradient accumulation; one optimizer step per mini-batch.

        `micro_loss(micro, num_tokens, num_seqs)` returns a micro-batch's loss and metrics (with `tokens`); the
        denominators are the mini-batch's GLOBAL token and sequence counts over all ranks divided by the world size
        (FSDP averages gradients over ranks), so the update is the same whatever the world size and micro-batch
        size. Returns metrics averaged over all ranks.
        """
        assert self.optimizer is not None and self.scheduler is not None, "a frozen engine does not train"
        rows = tensors[INPUT_IDS].shape[0]
        sums: dict[str, float] = {}
        steps = 0
        self.model.train()
        for _ in range(self.settings.epochs):
            for mini in even_slices(rows, self.settings.mini_batches):
                mini_tensors, _ = self._group_share(_take(tensors, mini))  # an SP group pools its ranks' rows
                tokens, seqs = self._global_counts(mini_tensors[RESPONSE_MASK])
                slices = self._micro_slices(mini_tensors[ATTENTION_MASK])
                for i, micro_rows in enumerate(slices):
                    self.model.set_requires_gradient_sync(i == len(slices) - 1)  # reduce once per mini-batch
                    loss, metrics = micro_loss(
                        _take(mini_tensors, micro_rows, self.device),
                        tokens / self.world_size,
                        seqs / self.world_size,
                    )
                    # a padding micro-batch (empty rows) keeps the collectives aligned but must not move the weights
                    real = micro_rows.stop > micro_rows.start
                    (loss * (1.0 if real else 0.0)).backward()
                    if real:
                        for key, value in _weighted(metrics).items():
                            sums[key] = sums.get(key, 0.0) + value
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._optimizer_step()
                steps += 1
        return self._reduce_metrics(sums, steps)

    def _optimizer_step(self) -> float:
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.settings.grad_clip)
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    def _global_counts(self, mask: torch.Tensor) -> tuple[float, float]:
        """Loss tokens and sequences of a mini-batch summed over all ranks (the loss denominators).

        The ranks of an SP group hold the same rows, counted once. Every one of them computes the group's loss, and
        the sequence-parallel backward gives each only its own tokens' share of the gradient, so FSDP's mean over
        the world still yields the gradient of the batch loss.
        """
        counts = torch.tensor(loss_denominators(mask), dtype=torch.float64)
        dist.all_reduce(counts)
        return float(counts[0]) / self.sp, float(counts[1]) / self.sp

    def _micro_slices(self, attention_mask: torch.Tensor) -> list[slice]:
        """Micro-batch row ranges (micro_batch_size rows, or consecutive rows within the token budget), padded with
        empty ranges so every rank runs the same number of passes."""
        rows, budget = attention_mask.shape[0], self.settings.max_tokens_per_micro_batch
        if budget is None:
            size = self.settings.micro_batch_size
            slices = [slice(i, min(i + size, rows)) for i in range(0, rows, size)]
        else:
            # the budget is per rank: an SP group's micro-batch is split over its sp ranks
            slices = token_budget_slices(attention_mask.sum(-1).tolist(), budget * self.sp)
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
            # loss contributions add up to the batch loss x world size (x sp: an SP group's ranks repeat theirs)
            if key.endswith("_loss"):
                out[key] = value / self.world_size / self.sp / max(steps, 1)
            elif key == "grad_norm":
                out[key] = value / self.world_size / max(steps, 1)
            else:
                out[key] = value / tokens
        out["lr"] = self.scheduler.get_last_lr()[0]
        return out

    # ---- weights, checkpoints ----------------------------------------------------------------------------------
    def named_full_params(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every parameter unsharded, in HF naming, gathered one FSDP unit (a decoder layer, then the root's
        embeddings, norm and head) at a time: one all-gather per unit, and never more than one unit unsharded.

        Collective: all ranks must drain the iterator. Each tensor is a copy that outlives its unit's gather, since
        a consumer may hold it past the next one (vLLM defers a layer whose padded weights were loaded in part).
        """
        units = [(name, m) for name, m in self.model.named_modules() if isinstance(m, FSDPModule)]
        nested = tuple(f"{name}." for name, _ in units if name)
        for prefix, unit in units:
            unit.unshard()
            for name, param in unit.named_parameters(prefix=prefix):
                if prefix or not name.startswith(nested):  # the root yields only what no layer owns
                    yield name, param.detach().clone()
            unit.reshard()

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
            optim = {}
            if self.optimizer.state:  # gathering a state-less optimizer would initialise it (Adam at step 1)
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
        flag = torch.tensor([0 if not saved else 2 if saved.get("optimizer") else 1])
        dist.broadcast(flag, 0)
        if not int(flag):
            return
        # flag 1: saved before the first step, so no state to set (setting an empty one would initialise it)
        if int(flag) == 2:
            set_optimizer_state_dict(self.model, self.optimizer, saved.get("optimizer", {}), options=options)
        holder = [saved.get("scheduler")]
        dist.broadcast_object_list(holder, 0)
        self.scheduler.load_state_dict(holder[0])

    def offload(self) -> None:
        """With settings.offload, move the sharded parameters and the optimizer state to host memory (the colocated
        rollout engine gets the GPU); otherwise a no-op, as on the CPU or under FSDP2's CPUOffloadPolicy."""
        if self.settings.offload and not self.settings.fsdp_cpu_offload:
            self._move_states(torch.device("cpu"))
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Undo `offload` before the next pass."""
        if self.settings.offload and not self.settings.fsdp_cpu_offload:
            self._move_states(self.device)

    @torch.no_grad()
    def _move_states(self, device: torch.device) -> None:
        self.model.to(device)  # FSDP2 reshards first, then moves each rank's shards (and any gradients)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":  # Adam's step counter stays put
                        state[key] = value.to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)


class FSDPTrainEngine(FSDPEngine):
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
        if self.sp_group is not None:  # every position's outputs on this rank's slice, gathered, then picked

            def per_token(logits: torch.Tensor, next_tokens: torch.Tensor) -> dict[str, torch.Tensor]:
                out = {LOG_PROBS: token_log_probs(logits, next_tokens, temperature)}
                if with_entropy:
                    out[ENTROPY] = entropy_from_logits(
                        logits if entropy_grad else logits.detach(), temperature
                    )
                return out

            outs = self._sequence_parallel_forward(window, per_token)
            log_probs, entropy = window.picked(outs[LOG_PROBS]), outs.get(ENTROPY)
            entropy = window.picked(entropy) if entropy is not None else None
        else:
            logits = window.kept(
                self.model(**window.inputs, use_cache=False, logits_to_keep=window.logits_to_keep).logits
            )
            log_probs = token_log_probs(logits, window.targets, temperature)
            entropy = None
            if with_entropy:
                entropy = entropy_from_logits(logits if entropy_grad else logits.detach(), temperature)
        return window.scatter(log_probs), window.scatter(entropy) if entropy is not None else None

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
        them); an `rollout_is_weights` column multiplies each token's policy-gradient loss.
        """
        on_policy = OLD_LOG_PROBS not in batch.tensors
        if on_policy and (self.settings.mini_batches, self.settings.epochs) != (1, 1):
            raise ValueError(
                "train_step without old_log_probs needs one mini-batch and one epoch (an on-policy update)"
            )
        # the full-vocabulary entropy costs a pass over the logits; its graph only when it is in the loss
        need_entropy = entropy_coef != 0.0 or on_policy
        old_parts: list[torch.Tensor] = []

        def micro_loss(micro: dict[str, torch.Tensor], num_tokens: float, num_seqs: float):
            log_probs, entropy = self._forward(micro, temperature, need_entropy, entropy_coef != 0.0)
            current = log_probs.detach()
            if on_policy:
                old_parts.append(current.cpu())
            loss, metrics = policy_loss(
                log_probs,
                current if on_policy else micro[OLD_LOG_PROBS],
                micro[ADVANTAGES],
                micro[RESPONSE_MASK],
                loss_cfg,
                entropy=entropy,
                entropy_coef=entropy_coef,
                ref_log_probs=micro.get(REF_LOG_PROBS),
                is_weights=micro.get(IS_WEIGHTS),
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


class FSDPCriticEngine(FSDPEngine):
    """The critic of PPO with GAE: the policy's architecture with a scalar value head (token classification)."""

    def __init__(self, model_path: str | Path, settings: TrainSettings, *, cliprange_value: float):
        super().__init__(load_value_model(model_path, dtype=DTYPES[settings.dtype]), settings)
        self.cliprange_value = cliprange_value

    def _forward(self, micro: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values [b, R]: V_t is read where the policy's logits for response token t are (the state before it)."""
        window = self._window(micro)
        if self.sp_group is not None:
            outs = self._sequence_parallel_forward(window, lambda logits, _: {VALUES: logits[..., 0].float()})
            return window.scatter(window.picked(outs[VALUES]))
        out = self.model(**window.inputs, use_cache=False)
        return window.scatter(window.picked(out.logits)[..., 0].float())

    def values(self, batch: Batch) -> Batch:
        """The critic's values (key `values`) of every response token, [B, R]."""
        return self._inference(batch, lambda micro: {VALUES: self._forward(micro)})

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One clipped value-regression update towards `returns` (see `FSDPEngine._update`)."""

        def micro_loss(micro: dict[str, torch.Tensor], num_tokens: float, num_seqs: float):
            return value_loss(
                self._forward(micro),
                micro[VALUES],
                micro[RETURNS],
                micro[RESPONSE_MASK],
                cliprange=self.cliprange_value,
                num_tokens=num_tokens,
            )

        return self._update(batch.tensors, micro_loss)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (model.model.layers for Llama / Qwen families)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)


def _take(
    tensors: dict[str, torch.Tensor], rows: slice, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """The rows of every tensor (on `device` when given); an empty slice stands for one dummy row (a padding
    micro-batch)."""
    if rows.stop <= rows.start:
        rows = slice(0, 1)
    return {k: v[rows] if device is None else v[rows].to(device) for k, v in tensors.items()}


def _own_storage(t: torch.Tensor) -> torch.Tensor:
    """A tensor that owns exactly its bytes (safetensors refuses views into larger gathered buffers)."""
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _weighted(metrics: dict[str, float]) -> dict[str, float]:
    """Loss contributions stay sums; local means become token-weighted sums (divided by total tokens later)."""
    tokens = metrics["tokens"]
    return {k: (v if k.endswith("_loss") or k == "tokens" else v * tokens) for k, v in metrics.items()}
