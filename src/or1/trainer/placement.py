"""Where a step's batch is sampled (rollout.placement): the protocol the training loop sees.

Two placements implement it, and the stage chooses one once (`or1.trainer.stage_session.choose_placement`):
`Colocated` (`trainer/colocated.py`), by the training ranks in turn with training, and `Separate`
(`trainer/separate.py`), by rollout replicas on devices of their own while the trainer trains. Both run the same
rollout rounds (`or1.trainer.step_sampler.StepSampler`) and hand the trainer a `Sampled`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from or1.hybrid.worker_group import WorkerGroup
from or1.trainer.checkpoint import CheckpointPart
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import Sampled, StepSampler


class RolloutPlacement(Protocol):
    """What the training loop asks of a placement, in the order it asks."""

    sampler: StepSampler

    def begin(self, step: int) -> None:
        """Training resumes after `step` (0: a fresh stage)."""

    def take(self, step: int, timer: PhaseTimer) -> Sampled:
        """Step `step`'s sampled batch; the sampling's phases go into `timer`."""

    def trained(self, step: int) -> dict[str, float]:
        """The update of `step` finished (or was skipped); the metrics this adds to the step."""

    def validating(self, step: int) -> AbstractContextManager[WorkerGroup]:
        """The engines to validate with, on the weights after `step`."""

    def end(self) -> None:
        """Training stops: nothing more is sampled."""

    def shutdown(self) -> None:
        """Release the placement's own actors (the training ranks are the caller's)."""

    def checkpoint_parts(self) -> list[CheckpointPart]:
        """What the placement itself keeps in a checkpoint, besides the worker groups and the controller's parts."""
