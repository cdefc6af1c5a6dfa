"""What the controller asks of a rollout call (`SamplingRequest`), and the one formula of its sampling seeds.

The controller builds a request for every call, training's from the recipe's rollout settings and validation's from
its own, and passes it beside the prompts to the rollout worker's `stream_sequences` (every rank receives the same
one); the worker turns it into its engine's SamplingParams. Every sampling seed of a run derives from trainer.seed in
`sampling_seed`, so the seeds are fixed by (seed, step, refill round, tensor-parallel group): a resumed run samples
exactly what the interrupted one would have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from or1.config.schema import RunConfig


def sampling_seed(seed: int, step: int | None, refill_round: int, tp_group: int) -> int:
    """The engine seed of one rollout call on one tensor-parallel group; `step` None is a validation call."""
    if step is None:
        # validation samples with the same seeds every time (common random numbers), apart from training's
        base, step = seed + 7919, 0
    else:
        # a refill round samples the same step again: another base seed, so other samples
        base = seed + 1_000_003 * refill_round
    # fixed by step and group, so a resumed run samples the same, yet different for each step and group
    return (base * 1_000_003 + step * 7919 + tp_group * 104_729) % (2**31 - 1)


def round_seed(seed: int, step: int, row: int, round_: int) -> int:
    """The engine seed of one response's partial-rollout round (`or1.trainer.partial`): fixed by (seed, step, the
    response's row in its step, the round), so a response's tokens depend on neither its round's other rows nor
    timing."""
    base = sampling_seed(seed, step, 0, 0)
    return (base * 1_000_003 + row * 104_729 + round_ * 7919 + 1) % (2**31 - 1)


@dataclass(frozen=True)
class SamplingRequest:
    """One rollout call's sampling, decided by the controller and the same for every rank of the call."""

    n: int  # samples per prompt
    temperature: float
    top_p: float
    max_response_length: int  # the response budget, in tokens
    seed: int  # the run's trainer.seed (`sampling_seed` derives the engine's from it)
    step: int | None  # the training step sampled for; None: a validation
    refill_round: int = 0  # > 0: an extra sampling round of the step (dynamic sampling's refill)

    @classmethod
    def training(cls, cfg: RunConfig, step: int, refill_round: int = 0) -> SamplingRequest:
        """A training step's request: the recipe's rollout settings."""
        r = cfg.rollout
        return cls(r.n, r.temperature, r.top_p, r.max_response_length, cfg.trainer.seed, step, refill_round)

    def engine_seed(self, tp_group: int) -> int:
        """The seed of this call's engine on tensor-parallel group `tp_group`."""
        return sampling_seed(self.seed, self.step, self.refill_round, tp_group)
