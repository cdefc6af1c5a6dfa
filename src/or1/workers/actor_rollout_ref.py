"""The hybrid worker: actor (FSDP2 training engine), rollout engine and, only when a KL term is on, reference policy.

One instance per data-parallel rank, all three roles in the same process so weights move from training to sampling
in memory: before a generation that follows an update, the rollout engine (`rollout.engine`: the HF loop or vLLM)
receives the actor's weights, and on a GPU the two take turns with the device's memory (`weight_handoff`). The
controller calls the @register methods through a WorkerGroup; DP_COMPUTE methods see only this rank's share.

`stream_sequences` / `generate_sequences` sample what the controller's SamplingRequest asks (`hybrid.sampling`); the
columns they return are `rollout_rows`'.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from or1.algos.losses import LossConfig
from or1.config.schema import RunConfig
from or1.engines.loading import load_rollout_engine
from or1.engines.rollout import EngineSettings, RolloutEngine, SamplingParams
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ADVANTAGES,
    ENTROPY,
    IS_WEIGHTS,
    LOG_PROBS,
    OLD_LOG_PROBS,
    PROMPT_IDS,
    REF_LOG_PROBS,
    SEQUENCE_COLUMNS,
)
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker import Worker
from or1.layout import CHECKPOINT_MODEL_DIR, rank_rng_file
from or1.plan.peak import DevicePeak, device_peak
from or1.rng import ProcessRNG
from or1.tokens import load_tokenizer
from or1.workers.rollout_rows import FinishedRows
from or1.workers.weight_handoff import WeightHandoff, tolerance


class ActorRolloutRefWorker(Worker):
    """Actor + rollout (+ reference) of one rank; `init_model` must run before anything else."""

    def __init__(self, config: RunConfig, model_path: str, threads: int | None = None):
        if threads:
            self.set_threads(threads)
        self.cfg = config
        self.model_path = model_path
        self.loss_cfg = LossConfig.from_config(config)
        self.init_distributed()

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load tokenizer, FSDP2 actor, the rollout engine and (KL only) the reference policy."""
        # Imported here, in the rank's process: the controller imports this class only to dispatch to it, and the
        # training stack (FSDP2, transformers' model classes) costs seconds of CPU at start-up.
        from or1.engines.fsdp_actor import FSDPTrainEngine
        from or1.engines.train_settings import TrainSettings

        torch.manual_seed(self.cfg.trainer.seed + self.rank)
        settings = TrainSettings.from_config(self.cfg, device=str(self.device))
        self.tokenizer = load_tokenizer(self.model_path)
        self.actor = FSDPTrainEngine(self.model_path, settings)
        self.rollout_dtype = self.cfg.rollout.dtype or settings.compute_dtype
        self.rollout = self._build_rollout(self.rollout_dtype)
        r = self.cfg.rollout
        self.handoff = WeightHandoff(
            self.actor,
            self.rollout,
            self.tokenizer,
            check=r.weight_sync_check,
            tolerance=tolerance(r.weight_sync_tolerance, self.rollout_dtype, settings.compute_dtype),
        )
        self.weights_version = 0  # the actor's: one more at every change (the rollout starts on version 0)
        self.step = 0  # the training step of the latest generation (validation samples after it)
        kl = self.cfg.algorithm.kl
        self.ref = FSDPTrainEngine(self.model_path, settings, trainable=False) if kl.enabled else None
        if self.ref is not None:
            self.ref.offload()  # needed only for its own pass (actor.offload)
        self.rollout.sleep()  # the actor holds the GPU outside handoff.rollout_phase
        return {"rank": self.rank, "parameters": sum(p.numel() for p in self.actor.model.parameters())}

    def _build_rollout(self, dtype: str) -> RolloutEngine:
        r = self.cfg.rollout
        tp = r.tensor_parallel_size if r.engine == "vllm" else 1
        if self.world_size % tp:
            raise ValueError(f"rollout.tensor_parallel_size {tp} does not divide the {self.world_size} ranks")
        # Ranks [g*tp, (g+1)*tp) form tensor-parallel group g: they sample the same prompts together.
        self.tp_size, self.tp_rank, self.tp_index = tp, self.rank % tp, self.rank // tp
        groups = (
            [dist.new_group(list(range(g, g + tp))) for g in range(0, self.world_size, tp)] if tp > 1 else []
        )
        self.tp_group = groups[self.tp_index] if groups else None
        if r.engine == "vllm" and self.device.type == "cuda":
            # vLLM's external launcher takes cuda:<LOCAL_RANK>; Ray shows each rank only its own GPU (cuda:0)
            os.environ["LOCAL_RANK"] = str(self.device.index)
        settings = EngineSettings(
            dtype=dtype,
            seed=self.cfg.trainer.seed,
            micro_batch_size=r.micro_batch_size,
            max_model_len=self.cfg.data.max_prompt_length + self._longest_response(),
            tensor_parallel_size=tp,
            gpu_memory_utilization=r.gpu_memory_utilization,
            cpu_kv_cache_gib=r.cpu_kv_cache_gib,
            distributed=True,  # every rank builds its vLLM engine in this same call (ONE_TO_ALL)
        )
        return load_rollout_engine(
            r.engine, self.model_path, settings, tokenizer=self.tokenizer, device=self.device
        )

    def _longest_response(self) -> int:
        """The largest budget this worker samples with: training's, or validation's when larger."""
        validation = getattr(self.cfg.data.validation, "max_response_length", None) or 0
        return max(self.cfg.rollout.max_response_length, validation)

    # ---- rollout ---------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def generate_sequences(self, prompts: Batch, request: SamplingRequest) -> Batch:
        """Sample request.n responses per prompt with the current actor weights (columns: `rollout_rows`)."""
        *_, batch = self.stream_sequences(prompts, request)
        return batch

    @register(Dispatch.DP_COMPUTE)
    def stream_sequences(
        self, prompts: Batch, request: SamplingRequest
    ) -> Iterator[list[dict[str, Any]] | Batch]:
        """`generate_sequences` that first yields the reward inputs of its rows as soon as they are final, in a few
        groups per call (`rollout_rows.FinishedRows`), so the controller scores them while the other rows still
        decode; the last item is the Batch."""
        if request.step is not None:
            self.step = request.step
        where = f"step {self.step}" if request.step is not None else f"validation after step {self.step}"
        sampling = self._sampling_params(request)
        prompt_ids = [list(p) for p in prompts[PROMPT_IDS]]
        group_prompts, mine = self._tensor_parallel_share(prompt_ids)
        rows = FinishedRows(prompts, mine, request.n, self.rank, self.tokenizer)
        with self.handoff.rollout_phase(self.weights_version, where):
            for part in self.rollout.stream_ids(group_prompts, sampling):
                if ready := rows.add(part):
                    yield ready
        if rest := rows.rest():
            yield rest
        pad_id = self.rollout.pad_token_id
        yield rows.batch(prompt_ids, self.cfg.data.max_prompt_length, request.max_response_length, pad_id)

    def _sampling_params(self, request: SamplingRequest) -> SamplingParams:
        """The engine's sampling for `request` on this rank's tensor-parallel group (its seed is the group's)."""
        return SamplingParams(
            n=request.n,
            temperature=request.temperature,
            top_p=request.top_p,
            max_response_length=request.max_response_length,
            stop_token_ids=[],
            seed=request.engine_seed(self.tp_index),
        )

    def _tensor_parallel_share(self, prompt_ids: list[list[int]]) -> tuple[list[list[int]], slice]:
        """All prompts of this rank's tensor-parallel group (its engines serve them together) and this rank's slice.

        With tensor_parallel_size 1 that is just this rank's own prompts.
        """
        if self.tp_group is None:
            return prompt_ids, slice(0, len(prompt_ids))
        shares: list[Any] = [None] * self.tp_size
        dist.all_gather_object(shares, prompt_ids, group=self.tp_group)
        start = sum(len(share) for share in shares[: self.tp_rank])
        return [p for share in shares for p in share], slice(start, start + len(prompt_ids))

    # ---- log-probs -------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Old log-probs of the sampled responses and their full-vocabulary entropy, [B, R] each."""
        out = self.actor.log_probs(
            batch.only(SEQUENCE_COLUMNS), temperature=self.cfg.rollout.temperature, with_entropy=True
        )
        return Batch({OLD_LOG_PROBS: out.tensors[LOG_PROBS], ENTROPY: out.tensors[ENTROPY]})

    @register(Dispatch.DP_COMPUTE)
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        """Reference-policy log-probs [B, R]; only valid when algorithm.kl.enabled loaded a reference model."""
        if self.ref is None:
            raise RuntimeError(
                "compute_ref_log_prob called but algorithm.kl.enabled is false (no reference model)"
            )
        self.ref.onload()
        try:
            out = self.ref.log_probs(batch.only(SEQUENCE_COLUMNS), temperature=self.cfg.rollout.temperature)
        finally:
            self.ref.offload()
        return Batch({REF_LOG_PROBS: out.tensors[LOG_PROBS]})

    # ---- update ----------------------------------------------------------------------------------------------------
    @register(Dispatch.DP_COMPUTE)
    def update_actor(self, batch: Batch, entropy_coef: float = 0.0) -> dict[str, float]:
        """One PPO-clip update on this rank's share; returns metrics already averaged over all ranks.

        Without `old_log_probs` the update is on-policy and takes them from its own forward (actor.old_log_prob).
        """
        columns = [*SEQUENCE_COLUMNS, ADVANTAGES, *(c for c in (OLD_LOG_PROBS, IS_WEIGHTS) if c in batch)]
        if self.loss_cfg.needs_ref:
            columns.append(REF_LOG_PROBS)
        self.weights_version += 1
        return self.actor.train_step(
            batch.only(columns),
            self.loss_cfg,
            temperature=self.cfg.rollout.temperature,
            entropy_coef=entropy_coef,
        )

    @register(Dispatch.DP_COMPUTE)
    def fused_old_log_probs(self, batch: Batch) -> Batch:
        """The old log-probs [B, R] the last on-policy update took from its own forward, for this rank's share of
        the same rows (`batch` only splits like the update's; the sampler-mismatch metrics read them)."""
        if self.actor.on_policy_log_probs is None or len(self.actor.on_policy_log_probs) != len(batch):
            raise RuntimeError("fused_old_log_probs called without a matching on-policy update before it")
        return Batch({OLD_LOG_PROBS: self.actor.on_policy_log_probs})

    @register(Dispatch.ONE_TO_ALL)
    def device_peak(self) -> DevicePeak:
        """This rank's peak FLOP/s in the actor's compute dtype (MFU's denominator): a GPU's datasheet figure, or a
        short matmul benchmark (the CPU, a GPU the table lacks)."""
        return device_peak(self.device, self.actor.settings.compute_dtype)

    # ---- checkpoints -----------------------------------------------------------------------------------------------
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Rank 0 writes the HF model folder + optimizer under path/model; every rank writes its RNG state."""
        folder = Path(path)
        self.actor.save(folder / CHECKPOINT_MODEL_DIR)
        if self.rank == 0:
            self.tokenizer.save_pretrained(folder / CHECKPOINT_MODEL_DIR, save_jinja_files=False)
        torch.save(ProcessRNG().state_dict(), folder / rank_rng_file(self.rank))

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        """Restore what save_checkpoint wrote (model, optimizer, this rank's RNG when the world size matches)."""
        folder = Path(path)
        self.actor.load(folder / CHECKPOINT_MODEL_DIR)
        self.weights_version += 1
        rng_file = folder / rank_rng_file(self.rank)
        if rng_file.is_file():
            ProcessRNG().load_state_dict(torch.load(rng_file, weights_only=False))

    @register(Dispatch.ONE_TO_ALL)
    def export_model(self, path: str) -> None:
        """Rank 0 writes a plain HF model folder (weights, config, tokenizer) without optimizer state."""
        self.actor.save(Path(path), with_optimizer=False)
        if self.rank == 0:
            self.tokenizer.save_pretrained(Path(path), save_jinja_files=False)
