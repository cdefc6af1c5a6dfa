"""The critic worker: PPO's value model for GAE, one per data-parallel rank, colocated with the actor.

It lives in the same process as the rank's ActorRolloutRefWorker (`colocate`), shares its torch.distributed group
and device, and is only started when algorithm.advantage is gae. Columns: `compute_values` reads the packed
sequences and returns `values` [B, R]; `update_critic` also reads `values` (the ones the advantages were computed
from, the centre of the value clip) and `returns` [B, R].
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from or1.config.schema import RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import CRITIC_COLUMNS, SEQUENCE_COLUMNS
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.worker import Worker
from or1.layout import CHECKPOINT_CRITIC_DIR


class CriticWorker(Worker):
    """The value model of one rank; `init_model` must run before anything else."""

    def __init__(self, config: RunConfig, model_path: str, threads: int | None = None):
        if threads:
            self.set_threads(threads)
        self.cfg = config
        self.model_path = model_path
        self.init_distributed()  # a no-op beside the actor: the colocated roles share one process group

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict[str, Any]:
        """Load the value model; a new value head is drawn from the same seed on every rank."""
        # in the rank's process, as the actor's init_model does
        from or1.engines.fsdp_critic import FSDPCriticEngine
        from or1.engines.train_settings import TrainSettings

        settings = TrainSettings.from_config(self.cfg, self.cfg.critic, device=str(self.device))
        with torch.random.fork_rng(
            devices=[]
        ):  # leaves the rank's own RNG stream (seeded by the actor) alone
            torch.manual_seed(self.cfg.trainer.seed)
            self.engine = FSDPCriticEngine(
                self.model_path,
                settings,
                cliprange_value=self.cfg.critic.cliprange_value,
            )
        return {"rank": self.rank, "parameters": sum(p.numel() for p in self.engine.model.parameters())}

    @register(Dispatch.DP_COMPUTE)
    def compute_values(self, batch: Batch) -> Batch:
        """Values [B, R] of every response token of this rank's share."""
        return self.engine.values(batch.only(SEQUENCE_COLUMNS))

    @register(Dispatch.DP_COMPUTE)
    def update_critic(self, batch: Batch) -> dict[str, float]:
        """One clipped value-regression update towards `returns`; metrics already averaged over all ranks."""
        return self.engine.train_step(batch.only(CRITIC_COLUMNS))

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        """Rank 0 writes the critic's HF folder and optimizer under path/critic (the actor writes its RNG)."""
        self.engine.save(Path(path) / CHECKPOINT_CRITIC_DIR)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        self.engine.load(Path(path) / CHECKPOINT_CRITIC_DIR)

    @register(Dispatch.ONE_TO_ALL)
    def export_model(self, path: str) -> None:
        """Rank 0 writes the critic's HF folder without optimizer state (a later stage's start critic)."""
        self.engine.save(Path(path), with_optimizer=False)
