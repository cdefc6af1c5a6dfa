"""What a step samples: the loader's prompts in rollout rounds (generate, score as rows finish, the truncation policy,
dynamic sampling's refill), whichever engines run the rounds (`or1.trainer.placement` decides where).

The trainer applies what it consumes of a `Sampled` (prompt statistics, the loader's position) only when it trains on
that batch (`ConsumedLoader`), so a checkpoint never counts a batch sampled ahead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from or1.algos.filters import RefillBuffer
from or1.config.schema import RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ATTENTION_MASK,
    PROMPT_KEY,
    RESPONSE_LENGTH,
    REWARD_COLUMNS,
    REWARD_HIDDEN,
    REWARD_SECONDS,
    REWARDS,
    UID,
)
from or1.hybrid.sampling import SamplingRequest
from or1.scoring import RewardManager, ScoringSession
from or1.trainer.phases import truncation_policy
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.step_log import PhaseTimer


@dataclass
class Sampled:
    """One step's sampling: the first round's rows (what the step logs as sampled), the batch to train on (all rounds,
    refill's selection), every round's (prompt keys, rewards) for the prompt statistics, the loader's position after
    the step's prompts, and the sampling's phase seconds and generated tokens."""

    first: Batch
    batch: Batch
    rounds: list[tuple[Any, Any]]
    loader_state: dict[str, int]
    timer: PhaseTimer
    metrics: dict[str, float] = field(default_factory=dict)  # the pipeline's async/ metrics of the step


# A rollout call: (on_rows, prompts, request) -> the call's Batch, each finished row's reward inputs sent to
# on_rows(rank, rows) as they come
Stream = Callable[[Callable[[int, Any], None], Batch, SamplingRequest], Batch]


class ConsumedLoader:
    """The prompt loader as a checkpoint part: its position after the last step trained, not after the batches the
    replicas sampled ahead (those are sampled again after a resume, with the same prompts and seeds)."""

    def __init__(self, loader: PromptLoader) -> None:
        self.loader, self.consumed = loader, loader.state_dict()

    def state_dict(self) -> dict[str, int]:
        return dict(self.consumed)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)
        self.consumed = dict(state)


@dataclass
class StepSampler:
    """A step's rollout rounds through a rollout call (`Stream`): the loader's prompts, scored as rows finish."""

    cfg: RunConfig
    loader: PromptLoader
    rewards: RewardManager

    def sample(self, step: int, stream: Stream, timer: PhaseTimer) -> Sampled:
        """A round of the loader's prompts and, with algorithm.refill, DAPO's dynamic sampling: more rounds until
        batch_size informative groups, or the rounds run out."""
        first = self.round(step, 0, stream, timer)
        rounds, batch = [first], first
        if self.cfg.algorithm.refill:
            buffer = RefillBuffer(self.cfg.trainer.batch_size, self.cfg.algorithm.max_refill_rounds)
            parts, more = [], first
            while True:
                parts.append(more.select(buffer.add(more.tensors[REWARDS], more.non_tensor[UID])))
                if not buffer.needs_more:
                    break
                more = self.round(step, buffer.rounds, stream, timer)
                rounds.append(more)
            batch = Batch.concat(parts)
        stats = [(r.non_tensor[PROMPT_KEY], r.tensors[REWARDS]) for r in rounds]
        return Sampled(first, batch, stats, self.loader.state_dict(), timer)

    def round(self, step: int, round_: int, stream: Stream, timer: PhaseTimer) -> Batch:
        """Generate a batch of prompts' groups, score them and apply the truncation policy.

        Rows are scored as they finish: the ranks stream each finished row's reward inputs into a scoring session
        while the others still decode, so only the scoring left after the last row (`time/reward`) is on the
        sampling's critical path; `time/reward_hidden` is the scoring that ran during generation. A call whose
        rollout replica died is sampled again (`ReplicaReplaced`) into a new session: the rows the dead call streamed
        are never scored twice.
        """
        with timer("generate"):
            prompts = self.loader.next_batch(step, round_)
            request = SamplingRequest.training(self.cfg, step, round_)
            while True:
                session = self.rewards.session()

                def score_finished(_rank: int, rows: list[dict[str, Any]], session: Any = session) -> None:
                    session.submit([row.pop("key") for row in rows], rows)

                try:
                    batch = stream(score_finished, prompts, request)
                    break
                except ReplicaReplaced:
                    continue
        return self.score(batch, session, timer)

    def score(self, batch: Batch, session: ScoringSession, timer: PhaseTimer) -> Batch:
        """A generated batch's scores (the rows not streamed into `session` yet are scored now) under the truncation
        policy; its sequences count as generated."""
        sequences = batch.tensors[ATTENTION_MASK].sum(-1).tolist()
        timer.generated.extend(zip(sequences, batch.tensors[RESPONSE_LENGTH].tolist(), strict=True))
        with timer("reward"):
            scored = self.rewards.compute_scores(batch.only(REWARD_COLUMNS), session)
            batch = truncation_policy(
                batch.union(Batch(scored.tensors, scored.non_tensor)), self.cfg.algorithm
            )
        for ability, seconds in scored.meta[REWARD_SECONDS].items():
            timer.add(f"reward_{ability}", seconds)
        timer.add("reward_hidden", scored.meta[REWARD_HIDDEN])
        return batch


class ReplicaReplaced(RuntimeError):
    """A rollout replica died during a call and was replaced: the call's rows are void, sample them again."""
