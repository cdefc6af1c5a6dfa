"""The training engines' shared machinery: a Hugging Face model sharded with FSDP2, its AdamW optimiser, the passes.

`FSDPEngine` is what both roles build on: the policy (`fsdp_actor.FSDPPolicyEngine`: log-probs, entropy, the PPO-clip
update) and PPO's critic (`fsdp_critic.FSDPCriticEngine`: values, the clipped value update). One engine of each role
lives in every data-parallel rank (ActorRolloutRef and Critic workers, colocated); `train_settings` holds what they
read from the recipe. `torch.distributed` must already be initialised (gloo on CPU; on GPU nccl for CUDA tensors and
gloo for the CPU tensors of the bookkeeping collectives); every method that touches the model is collective: all
ranks call it with shards of equal size (DP_COMPUTE dispatch guarantees that, and the engine pads the micro-batch
count anyway).

Batch layout (tensors, first dim = sequences): `input_ids` / `attention_mask` [B, P + R] with left-padded prompts
and right-padded responses, `responses` / `response_mask` [B, R] (the last R columns of input_ids; response_mask
is the loss mask), plus `old_log_probs`, `advantages` (and `ref_log_probs`) [B, R] for the policy's update and
`values`, `returns` [B, R] for the critic's. Micro-batches hold `micro_batch_size` rows, or as many consecutive
rows as fit `max_tokens_per_micro_batch` tokens. With `remove_padding` a micro-batch's sequences are packed
end to end into one row (`packing.packed_window`: position ids restart at 0 per sequence) and attention runs inside
each sequence from their boundaries (`varlen`: flash varlen on CUDA, per-segment sdpa on the CPU, never a mask), so
no compute goes to pad tokens; without it, the micro-batch is cut to its longest prompt and response and padded
(on the CPU through `attention.grouped_sdpa`). Either way the outputs come back in the [b, R] layout above.

On CUDA the settings' mixed-precision and offload policies (`train_settings.fsdp_policies`) go to fully_shard;
`actor.offload` moves the sharded parameters and optimizer state to host memory between phases (`offload` /
`onload`, called by the worker around the colocated rollout). Micro-batches move to the device inside the passes and
results come back on the CPU.

Sequence parallelism (settings.sequence_parallel_size = sp > 1, see `ulysses`): the world is a (dp, sp) mesh whose
sp groups are consecutive ranks; FSDP still shards over all ranks. Each rank receives its own DP_COMPUTE share; the
ranks of a group pool their shares (mini-batch by mini-batch), every one of them runs the group's micro-batches,
each packed into one row and split token-wise over the group, and each returns the outputs of its own share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

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
from torch.distributed.fsdp import FSDPModule, fully_shard
from transformers import PreTrainedModel

from or1.algos.aggregation import loss_denominators
from or1.engines import activation_offload, ulysses, varlen
from or1.engines.activation_offload import HostInputs
from or1.engines.cpu_attention import use_grouped_sdpa
from or1.engines.loading import decoder_layers
from or1.engines.packing import Window, even_slices, packed_window, padded_window, token_budget_slices
from or1.engines.train_settings import TrainSettings, fsdp_policies
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import ATTENTION_MASK, INPUT_IDS, RESPONSE_MASK

# micro-batch tensors -> outputs [b, R] by name (an inference pass)
MicroForward = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]
# (micro-batch tensors, global tokens / world size, global sequences / world size) -> (loss, metrics with `tokens`)
MicroLoss = Callable[[dict[str, torch.Tensor], float, float], tuple[torch.Tensor, dict[str, float]]]

OPTIMIZER_FILE = "optimizer.pt"


class FSDPEngine:
    """An HF model under FSDP2 (each decoder layer and the root sharded) with AdamW and a warm-up schedule.

    The machinery the policy (FSDPPolicyEngine) and the critic (FSDPCriticEngine) share: sharding, micro-batch
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
        if self.sp_group is None and settings.remove_padding:
            varlen.enable(model)
        elif self.sp_group is None and self.device.type == "cpu":
            use_grouped_sdpa(model)
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        # Aliases of tied weights (lm_head.weight when embeddings are tied): left out of saved checkpoints.
        unique = {name for name, _ in model.named_parameters()}
        self.tied_aliases = {name for name, _ in model.named_parameters(remove_duplicate=False)} - unique
        # actor.activation_offload: this micro-batch's block inputs on the host
        self.host_inputs = HostInputs()
        if settings.gradient_checkpointing:
            offload = settings.activation_offload
            activation_offload.checkpoint_blocks(model, (lambda: self.host_inputs) if offload else None)
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
        """The model inputs of a micro-batch, packed (always under SP) or padded as the settings say."""
        packed = self.sp_group is not None or self.settings.remove_padding
        return packed_window(micro) if packed else padded_window(micro)

    def _sequence_parallel_forward(
        self, window: Window, per_token: ulysses.PerToken, hidden: bool = False
    ) -> dict[str, torch.Tensor]:
        """[1, N] outputs of a packed window through Ulysses: per_token of the logits (or `hidden` states)."""
        ids, positions, segments = window.inputs["input_ids"], window.inputs["position_ids"], window.segments
        return ulysses.packed_forward(
            self.model, ids, positions, segments, self.sp_group, per_token, hidden=hidden
        )

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
                    self.host_inputs = HostInputs()  # the last micro-batch's copies go with its backward
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
        # FSDP2 reshards first, then moves each rank's shards (and gradients). non_blocking: copies to the host land
        # in pinned memory from torch's caching host allocator, reused from one offload to the next (on an H200,
        # 55 GB/s against 1.4 GB/s into fresh pageable memory)
        self.model.to(device, non_blocking=True)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, torch.Tensor) and key != "step":  # Adam's step counter stays put
                        state[key] = value.to(device, non_blocking=True)
        torch.cuda.synchronize(self.device)  # both ways: nothing reads a tensor before its copy has landed


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
