"""Where a step's batch is sampled: by the training ranks in turn with training (`Colocated`), or by rollout replicas
on devices of their own while the trainer trains (`Pipelined`, rollout.placement separate).

Both run the same rollout rounds (`StepSampler`: generate, score as rows finish, the truncation policy, dynamic
sampling's refill) and hand the trainer a `Sampled`; the trainer applies what it consumes (prompt statistics,
the loader's position) only when it trains on that batch, so a checkpoint never counts a batch sampled ahead.

The pipelined schedule, with k = rollout.max_staleness: the batch of step s is sampled with the weights after step
s-1-k (version max(0, s-1-k)), so while the trainer trains step s the replicas sample step s+k. Every batch is
sampled from a version fixed by its step, never by timing, so an asynchronous run is as reproducible as a
synchronous one: its staleness is exactly min(k, s-1), never more, and no group ever waits past the bound (there is
nothing to drop). The replicas swap weights between calls (a Ray actor runs one at a time), never inside one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from or1.algos.filters import RefillBuffer
from or1.config.schema import RunConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    POLICY_VERSION,
    PROMPT_KEY,
    RESPONSE_LENGTH,
    REWARD_COLUMNS,
    REWARD_HIDDEN,
    REWARD_SECONDS,
    REWARDS,
    UID,
)
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import WorkerError, WorkerGroup
from or1.layout import ROLLOUT_WEIGHTS_FILE, rollout_weights_file
from or1.scoring import RewardManager
from or1.trainer.phases import truncation_policy
from or1.trainer.prompt_loader import PromptLoader
from or1.trainer.step_log import PhaseTimer
from or1.workers.rollout_worker import load_published, save_published


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
        timer.add_tokens("generate", float(batch.tensors[RESPONSE_LENGTH].sum()))
        with timer("reward"):
            scored = self.rewards.compute_scores(batch.only(REWARD_COLUMNS), session)
            batch = truncation_policy(
                batch.union(Batch(scored.tensors, scored.non_tensor)), self.cfg.algorithm
            )
        for ability, seconds in scored.meta[REWARD_SECONDS].items():
            timer.add(f"reward_{ability}", seconds)
        timer.add("reward_hidden", scored.meta[REWARD_HIDDEN])
        return batch


class Colocated:
    """Sampling on the training ranks, step by step: each step samples right before it trains (staleness 0)."""

    def __init__(self, actor: WorkerGroup, sampler: StepSampler) -> None:
        self.actor, self.sampler = actor, sampler

    def begin(self, step: int) -> None:
        pass

    def take(self, step: int, timer: PhaseTimer) -> Sampled:
        return self.sampler.sample(step, self.stream, timer)

    def stream(self, on_rows: Callable[[int, Any], None], prompts: Batch, request: SamplingRequest) -> Batch:
        return self.actor.stream("stream_sequences", on_rows, prompts, request)

    def trained(self, step: int) -> dict[str, float]:
        return {}

    @contextmanager
    def validating(self, step: int) -> Iterator[WorkerGroup]:
        yield self.actor

    def end(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class Pipelined:
    """Rollout replicas sampling up to k steps ahead of the trainer (module docstring), in a thread of the controller.

    The trainer publishes its weights after every update (`trained`); a replica killed mid-call is replaced
    (`start_replicas`, up to trainer.max_restarts times) and the call sampled again in a new scoring session, so no
    group is lost or counted twice.
    """

    def __init__(
        self,
        actor: WorkerGroup,
        sampler: StepSampler,
        replicas: WorkerGroup,
        start_replicas: Callable[[], WorkerGroup],
        max_restarts: int,
    ) -> None:
        self.actor, self.sampler, self.replicas = actor, sampler, replicas
        self.start_replicas, self.max_restarts = start_replicas, max_restarts
        self.k, self.steps = sampler.cfg.rollout.max_staleness, sampler.cfg.trainer.steps
        self.replica_version = 0  # the replicas start from the stage's model: version 0
        self.restarts = 0
        self.oldest = 0  # the oldest version there is to sample with (begin)
        self.in_flight = 0  # groups of the rollout call in progress
        self.versions: dict[int, Any] = {}  # version -> publish_weights' (weights ref, probe)
        self.ready: dict[int, Sampled] = {}
        self.error: BaseException | None = None
        self.stopping = False
        self.cond = threading.Condition()
        self.replica_lock = threading.Lock()  # one caller of the replicas at a time: weights, then sampling
        self.thread: threading.Thread | None = None

    # ---- the trainer's side ----------------------------------------------------------------------------------------
    def begin(self, step: int) -> None:
        """Publish the trainer's weights (version `step`, the last trained) and start sampling from step + 1.

        A resume has the k older versions its next steps sample with from the checkpoint; a checkpoint without them
        (one a colocated run wrote) starts from the oldest version there is: those steps sample fresher weights."""
        self.publish(step)
        self.oldest = min(self.versions)
        self.thread = threading.Thread(
            target=self._produce, args=(step + 1,), name="or1-rollout", daemon=True
        )
        self.thread.start()

    def take(self, step: int, timer: PhaseTimer) -> Sampled:
        """Step `step`'s sampling, waiting for it (the trainer's idle seconds: time/trainer_idle)."""
        began = time.perf_counter()
        with self.cond:
            while step not in self.ready and self.error is None:
                self.cond.wait()
            if step not in self.ready:
                raise RuntimeError(f"the rollout replicas failed sampling step {step}") from self.error
            sampled = self.ready.pop(step)
            ahead, in_flight = len(self.ready), self.in_flight
        timer.add("trainer_idle", time.perf_counter() - began)
        for (
            phase,
            seconds,
        ) in sampled.timer.seconds.items():  # the sampling's phases, overlapped with training
            timer.add(phase, seconds)
        for phase, tokens in sampled.timer.tokens.items():
            timer.add_tokens(phase, tokens)
        staleness = (step - 1) - sampled.batch.tensors[POLICY_VERSION].float()
        sampled.metrics = {
            "async/staleness_mean": float(staleness.mean()),
            "async/staleness_max": float(staleness.max()),
            "async/queue_depth": float(ahead),  # later steps already sampled when this one was taken (<= k)
            "async/groups_in_flight": float(in_flight),  # groups the replicas were sampling meanwhile
            "async/replica_restarts": float(self.restarts),
        }
        return sampled

    def trained(self, step: int) -> dict[str, float]:
        """The update of `step` finished (or was skipped): publish its weights to the replicas."""
        began = time.perf_counter()
        self.publish(step)
        return {"time/publish_weights": time.perf_counter() - began}

    def publish(self, version: int) -> None:
        published = self.actor.publish_weights()[0]
        with self.cond:
            self.versions[version] = published
            for old in [v for v in self.versions if v < version - self.k]:
                del self.versions[old]  # no batch to come is sampled with it
            self.cond.notify_all()

    @contextmanager
    def validating(self, step: int) -> Iterator[WorkerGroup]:
        """The replicas on the weights of `step` (the newest) for a validation; the sampling ahead waits."""
        with self.replica_lock:
            self._hold(step)
            yield self.replicas

    def end(self) -> None:
        """Stop sampling ahead (a call in progress ends with the replicas' shutdown)."""
        with self.cond:
            self.stopping = True
            self.cond.notify_all()

    def shutdown(self) -> None:
        self.end()
        self.replicas.shutdown()

    # ---- checkpoints: the older weight versions the steps after a resume sample with ------------------------------
    def save_checkpoint(self, path: str) -> None:
        with self.cond:
            latest = max(self.versions)
            older = {v: published for v, published in self.versions.items() if v < latest}
        for version, (weights, _probe) in older.items():
            save_published(weights, Path(path) / rollout_weights_file(version))

    def load_checkpoint(self, path: str) -> None:
        with self.cond:
            self.versions.clear()
            for file in Path(path).iterdir():
                if match := ROLLOUT_WEIGHTS_FILE.match(file.name):
                    self.versions[int(match.group(1))] = (load_published(file), None)

    # ---- the sampling thread ---------------------------------------------------------------------------------------
    def _produce(self, first: int) -> None:
        try:
            for step in range(first, self.steps + 1):
                timer = PhaseTimer()
                need = max(self.oldest, step - 1 - self.k)
                with self.cond:
                    began = time.perf_counter()
                    while need not in self.versions and not self.stopping:
                        self.cond.wait()
                    if self.stopping:
                        return
                timer.add("rollout_idle", time.perf_counter() - began)
                sampled = self.sampler.sample(step, lambda *a, need=need: self._stream(need, *a), timer)
                with self.cond:
                    self.ready[step] = sampled
                    self.cond.notify_all()
        except BaseException as e:  # noqa: BLE001 - handed to the trainer, which raises it
            with self.cond:
                if not self.stopping:
                    self.error = e
                self.cond.notify_all()

    def _stream(
        self, version: int, on_rows: Callable[[int, Any], None], prompts: Batch, request: SamplingRequest
    ) -> Batch:
        """One rollout call on the replicas holding `version`; a replica's death restarts them and samples again
        (the rows it streamed go with its scoring session: `StepSampler.round` opens a new one for the new call)."""
        while True:
            with self.replica_lock:
                try:
                    self._hold(version)
                    self.in_flight = len(prompts)
                    return self.replicas.stream("stream_sequences", on_rows, prompts, request)
                except WorkerError as e:
                    if not e.died or self.stopping or self.restarts >= self.max_restarts:
                        raise
                    self.restarts += 1
                    self.replicas.shutdown()
                    self.replicas, self.replica_version = self.start_replicas(), 0
                    raise ReplicaReplaced(str(e)) from e
                finally:
                    self.in_flight = 0

    def _hold(self, version: int) -> None:
        """The replicas on weights `version` (the caller holds replica_lock)."""
        if self.replica_version != version:
            with self.cond:
                published = self.versions[version]
            self.replicas.load_weights(version, published)
            self.replica_version = version


class ReplicaReplaced(RuntimeError):
    """A rollout replica died during a call and was replaced: the call's rows are void, sample them again."""
