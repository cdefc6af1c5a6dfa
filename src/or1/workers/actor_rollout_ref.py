"""The hybrid worker: actor (FSDP2 training engine), rollout engine and, only when a KL term is on, reference policy.

One instance per data-parallel rank, all three roles in the same process so weights move from training to sampling
in memory: before a generation that follows an update, the rollout engine (`rollout.engine`: the HF loop or vLLM)
receives the actor's weights, and on a GPU the two take turns with the device's memory (`weight_sync`). The
controller calls the @register methods through a WorkerGroup; DP_COMPUTE methods see only this rank's share.

`stream_sequences` / `generate_sequences` (`rollout_worker.RolloutRole`) sample what the controller's SamplingRequest
asks (`hybrid.sampling`); the columns they return are `rollout_rows`' and `policy_version`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import ray
import torch

from or1.algos.losses import LossConfig
from or1.compute.peak import DevicePeak, device_peak
from or1.config.schema import RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ADVANTAGES,
    ENTROPY,
    IS_WEIGHTS,
    LOG_PROBS,
    OLD_LOG_PROBS,
    REF_LOG_PROBS,
    ROLLOUT_LOG_PROBS,
    SEQUENCE_COLUMNS,
)
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker import Worker
from or1.hybrid.worker_group import free_address
from or1.layout import CHECKPOINT_MODEL_DIR, rank_rng_file
from or1.rng import ProcessRNG
from or1.tokens import load_tokenizer
from or1.workers import weight_transfer as transfer
from or1.workers.rollout_worker import RolloutRole
from or1.workers.weight_sync import WeightSync, actor_probe, tolerance


class ActorRolloutRefWorker(RolloutRole, Worker):
    """Actor + rollout (+ reference) of one rank; `init_model` must run before anything else. Under
    rollout.placement separate the rank has no rollout engine: the replicas (`RolloutWorker`) sample, and
    `publish_weights` hands them the actor's weights."""

    def __init__(self, config: RunConfig, model_path: str, threads: int | None = None):
        if threads:
            self.set_threads(threads)
        self.cfg = config
        self.model_path = model_path
        self.loss_cfg = LossConfig.from_config(config)
        self.snapshots: dict[
            int, dict[str, torch.Tensor]
        ] = {}  # version -> this rank's shard (collective route)
        self.init_distributed()

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load tokenizer, FSDP2 actor, the rollout engine and (KL only) the reference policy."""
        # Imported here, in the rank's process: the controller imports this class only to dispatch to it, and the
        # training stack (FSDP2, transformers' model classes) costs seconds of CPU at start-up.
        from or1.engines.fsdp_actor import FSDPPolicyEngine
        from or1.engines.train_settings import TrainSettings

        torch.manual_seed(self.cfg.trainer.seed + self.rank)
        settings = TrainSettings.from_config(self.cfg, device=str(self.device))
        self.tokenizer = load_tokenizer(self.model_path)
        self.actor = FSDPPolicyEngine(self.model_path, settings)
        r = self.cfg.rollout
        rollout_dtype = r.dtype or settings.compute_dtype
        self.probe_tolerance = tolerance(r.weight_sync_tolerance, rollout_dtype, settings.compute_dtype)
        if r.placement == "colocated":
            self.rollout = self._build_rollout(self.model_path, rollout_dtype)
            self.weight_sync = WeightSync(
                self.actor,
                self.rollout,
                self.tokenizer,
                check=r.weight_sync_check,
                tolerance=self.probe_tolerance,
            )
        self.weights_version = 0  # the actor's: one more at every change (the rollout starts on version 0)
        self.step = 0  # the training step of the latest generation (validation samples after it)
        kl = self.cfg.algorithm.kl
        self.ref = FSDPPolicyEngine(self.model_path, settings, trainable=False) if kl.enabled else None
        if self.ref is not None:
            self.ref.offload()  # needed only for its own pass (actor.offload)
        if r.placement == "colocated":
            self.rollout.sleep()  # the actor holds the GPU outside weight_sync.rollout_phase
        return {"rank": self.rank, "parameters": sum(p.numel() for p in self.actor.model.parameters())}

    def _sampling_phase(self, request: SamplingRequest) -> AbstractContextManager[Any]:
        """The engine holds the device, on the actor's current weights (pushed when they changed); the policy
        version is the step sampled for minus one: its weights are the ones after the step before."""
        if request.step is not None:
            self.step, self.policy_version = request.step, request.step - 1
        where = f"step {self.step}" if request.step is not None else f"validation after step {self.step}"
        return self.weight_sync.rollout_phase(self.weights_version, where)

    @register(Dispatch.ONE_TO_ALL)
    def publish_weights(self) -> tuple[ray.ObjectRef, tuple[list[int], list[float], float] | None] | None:
        """The actor's full weights for the rollout replicas of the separate placement (collective: every rank
        gathers; rank 0 puts them in Ray's object store and returns the reference, other ranks None), with the push
        probe's ids, the actor's log-probs of them and their tolerance when rollout.weight_sync_check."""
        weights = {name: tensor.cpu() for name, tensor in self.actor.named_full_params()}
        probe = self._push_probe()
        return (ray.put(weights), probe) if self.rank == 0 else None

    def _push_probe(self) -> tuple[list[int], list[float], float] | None:
        """The push probe's ids, the actor's log-probs of them and their tolerance when rollout.weight_sync_check
        (collective: every rank scores it)."""
        if not self.cfg.rollout.weight_sync_check:
            return None
        ids, log_probs = actor_probe(self.actor, self.tokenizer, self.tokenizer.pad_token_id or 0)
        return ids, log_probs, self.probe_tolerance

    # ---- the collective route to the replicas (rollout.weight_transfer collective, `weight_transfer`) -------------
    @register(Dispatch.ONE_TO_ALL)
    def snapshot_weights(self, version: int, keep_from: int) -> tuple[list[int], list[float], float] | None:
        """Keep this rank's shard of the weights after step `version` on the host (in the dtype the unsharded
        weights have), forget the snapshots before `keep_from`; rank 0 returns the push probe as publish_weights
        does."""
        self.snapshots = {v: s for v, s in self.snapshots.items() if v >= keep_from}
        self.snapshots[version] = transfer.local_shards(self.actor.model, self._unsharded_dtype)
        probe = self._push_probe()
        return probe if self.rank == 0 else None

    @register(Dispatch.ONE_TO_ALL)
    def weight_layout(self) -> list[transfer.TensorSpec]:
        """What a snapshot holds (every rank checks its own part of it)."""
        return transfer.layout(self.actor.model, self._unsharded_dtype, self.rank, self.world_size)

    @property
    def _unsharded_dtype(self) -> torch.dtype:
        """The dtype of the actor's weights unsharded (FSDP2 gathers them in the compute dtype)."""
        from or1.engines.train_settings import DTYPES

        return DTYPES[self.actor.settings.compute_dtype]

    @register(Dispatch.ONE_TO_ALL)
    def weight_group_address(self) -> tuple[str, int]:
        return free_address()  # the transfer group's store, served by rank 0

    @register(Dispatch.ONE_TO_ALL)
    def join_weight_group(self, host: str, port: int, world: int) -> None:
        """Join the transfer group as its rank `self.rank` (called aside, with the replicas joining)."""
        self.weight_group = transfer.WeightGroup(
            host,
            port,
            self.rank,
            world,
            self.world_size,
            self.cfg.rollout.weight_transfer_backend,
            self.device,
        )

    @register(Dispatch.ONE_TO_ALL)
    def send_weights(self, version: int, specs: list[transfer.TensorSpec], bucket_bytes: int) -> int:
        """Send the snapshot of `version` to the replicas (called aside, beside training); the bytes sent."""
        return self.weight_group.send(specs, self.snapshots[version], bucket_bytes)

    @register(Dispatch.ONE_TO_ALL)
    def save_weight_snapshots(self, path: str, versions: list[int]) -> None:
        chosen = {version: self.snapshots[version] for version in versions}
        transfer.save_snapshots(chosen, Path(path), self.rank, self.world_size)

    @register(Dispatch.ONE_TO_ALL)
    def load_weight_snapshots(self, path: str) -> list[int]:
        """The snapshots a checkpoint holds for this rank (none from another world size); their versions."""
        self.snapshots = transfer.load_snapshots(Path(path), self.rank, self.world_size)
        return sorted(self.snapshots)

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

        Without `old_log_probs` the update is on-policy and takes them from its own forward (actor.old_log_prob),
        and its importance weights from them and `rollout_log_probs` (algorithm.rollout_correction).
        """
        given = (OLD_LOG_PROBS, IS_WEIGHTS, ROLLOUT_LOG_PROBS)
        columns = [*SEQUENCE_COLUMNS, ADVANTAGES, *(c for c in given if c in batch)]
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
    def export_model(self, path: str) -> tuple[list[int], list[float], str]:
        """Rank 0 writes a plain HF model folder (weights, config, tokenizer) without optimizer state. Returns what
        the folder must reproduce (`or1.export.check_stage_final`): the push probe's ids, this actor's log-probs of
        them and the compute dtype they were taken in."""
        self.actor.save(Path(path), with_optimizer=False)
        if self.rank == 0:
            self.tokenizer.save_pretrained(Path(path), save_jinja_files=False)
        ids, log_probs = actor_probe(self.actor, self.tokenizer, self.tokenizer.pad_token_id or 0)
        return ids, log_probs, self.actor.settings.compute_dtype
