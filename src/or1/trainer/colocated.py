"""The colocated placement: the training ranks sample each step right before they train it (staleness 0)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from or1.hybrid.batch import Batch
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import WorkerGroup
from or1.trainer.checkpoint import CheckpointPart
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import Sampled, StepSampler
from or1.workers.rollout_worker import RolloutRole


class Colocated:
    """Sampling on the training ranks, step by step: each step samples right before it trains (staleness 0)."""

    def __init__(self, actor: WorkerGroup, sampler: StepSampler) -> None:
        self.actor, self.sampler = actor, sampler

    def begin(self, step: int) -> None:
        pass

    def take(self, step: int, timer: PhaseTimer) -> Sampled:
        return self.sampler.sample(step, self.stream, timer)

    def stream(self, on_rows: Callable[[int, Any], None], prompts: Batch, request: SamplingRequest) -> Batch:
        return self.actor.stream(RolloutRole.stream_sequences, on_rows, prompts, request)

    def trained(self, step: int) -> dict[str, float]:
        return {}

    @contextmanager
    def validating(self, step: int) -> Iterator[WorkerGroup]:
        yield self.actor

    def end(self) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def checkpoint_parts(self) -> list[CheckpointPart]:
        return []  # the worker groups hold everything
