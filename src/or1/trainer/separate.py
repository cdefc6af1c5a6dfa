"""The separate placement (rollout.placement separate): rollout replicas on devices of their own sample up to
k steps ahead of the trainer, in a thread of the controller.

The separate schedule, with k = rollout.max_staleness: the batch of step s is sampled with the weights after step
s-1-k (version max(0, s-1-k)), so while the trainer trains step s the replicas sample step s+k. Every batch is
sampled from a version fixed by its step, never by timing, so an asynchronous run is as reproducible as a
synchronous one: its staleness is exactly min(k, s-1), never more, and no group ever waits past the bound (there is
nothing to drop). The replicas swap weights between calls (a Ray actor runs one at a time), never inside one. With
rollout.partial a step's responses are sampled over several calls, rounds whose versions the schedule fixes too
(`or1.trainer.partial`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from or1.hybrid.actor_pool import RestartBudget
from or1.hybrid.batch import Batch
from or1.hybrid.columns import POLICY_VERSION
from or1.hybrid.sampling import SamplingRequest
from or1.hybrid.worker_group import WorkerError, WorkerGroup
from or1.run_metrics import STALENESS_MAX
from or1.trainer.checkpoint import CheckpointPart
from or1.trainer.partial import PartialRounds
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import ReplicaReplaced, Sampled, StepSampler
from or1.trainer.weight_routes import Published, weight_route
from or1.workers.rollout_worker import RolloutRole


class Separate:
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
        self.start_replicas, self.budget = start_replicas, RestartBudget(max_restarts)
        self.route = weight_route(sampler.cfg, actor)  # rollout.weight_transfer
        self.k, self.steps = sampler.cfg.rollout.max_staleness, sampler.cfg.trainer.steps
        self.replica_version = 0  # the replicas start from the stage's model: version 0
        self.oldest = 0  # the oldest version there is to sample with (begin)
        self.in_flight = 0  # groups of the rollout call in progress
        self.versions: dict[int, Published] = {}  # version -> what the route published
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
        produce = self._produce_partial if self.sampler.cfg.rollout.partial else self._produce
        self.thread = threading.Thread(target=produce, args=(step + 1,), name="or1-rollout", daemon=True)
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
        # the sampling's phases, overlapped with training
        for phase, seconds in sampled.timer.seconds.items():
            timer.add(phase, seconds)
        timer.generated.extend(sampled.timer.generated)
        staleness = (step - 1) - sampled.batch.tensors[POLICY_VERSION].float()
        sampled.metrics |= {
            "async/staleness_mean": float(staleness.mean()),
            STALENESS_MAX: float(staleness.max()),
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
        published = self.route.publish(version, version - self.k, self.replicas)
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

    @property
    def restarts(self) -> int:
        """Replicas started in dead ones' place so far."""
        return self.budget.used

    # ---- checkpoints: the older weight versions the steps after a resume sample with ------------------------------
    def checkpoint_parts(self) -> list[CheckpointPart]:
        return [self]

    def save_checkpoint(self, path: str) -> None:
        with self.cond:
            latest = max(self.versions)
            older = {v: published for v, published in self.versions.items() if v < latest}
        self.route.save(older, Path(path))

    def load_checkpoint(self, path: str) -> None:
        versions = self.route.load(Path(path))
        with self.cond:
            self.versions = versions

    # ---- the sampling thread ---------------------------------------------------------------------------------------
    def _produce(self, first: int) -> None:
        with self._producing():
            for step in range(first, self.steps + 1):
                timer = PhaseTimer()
                began = time.perf_counter()
                need = self._version_of(step)
                if need is None:
                    return
                timer.add("rollout_idle", time.perf_counter() - began)
                sampled = self.sampler.sample(step, lambda *a, need=need: self._stream(need, *a), timer)
                self._deliver(step, sampled)

    def _produce_partial(self, first: int) -> None:
        """Partial rollout's rounds (`or1.trainer.partial`) in place of one call per step."""
        with self._producing():
            pad_id = self.replicas.pad_token_id()[0]
            PartialRounds(self.sampler, pad_id).run(
                first, self.steps, self._version_of, self._continue, self._deliver
            )

    @contextmanager
    def _producing(self) -> Iterator[None]:
        """The sampling thread's body: what it raises goes to the trainer, which raises it."""
        try:
            yield
        except BaseException as e:  # noqa: BLE001
            with self.cond:
                if not self.stopping:
                    self.error = e
                self.cond.notify_all()

    def _version_of(self, step: int) -> int | None:
        """The version step `step` samples with (and partial rollout's round `step`), once published; None when
        sampling stops."""
        need = max(self.oldest, step - 1 - self.k)
        with self.cond:
            while need not in self.versions and not self.stopping:
                self.cond.wait()
            return None if self.stopping else need

    def _deliver(self, step: int, sampled: Sampled) -> None:
        with self.cond:
            self.ready[step] = sampled
            self.cond.notify_all()

    def _continue(
        self, version: int, rows: Batch, request: SamplingRequest, on_results: Callable[[int, Any], None]
    ) -> None:
        """A partial rollout round on the replicas holding `version`, each response's result to `on_results` as it
        comes; a replica's death restarts them and raises ReplicaReplaced (the round is sampled again for the
        responses it had not returned)."""
        groups = len(rows) // self.sampler.cfg.rollout.n
        self._call(version, RolloutRole.continue_responses, on_results, rows, request, groups)

    def _stream(
        self, version: int, on_rows: Callable[[int, Any], None], prompts: Batch, request: SamplingRequest
    ) -> Batch:
        """One rollout call on the replicas holding `version`; a replica's death restarts them and raises
        ReplicaReplaced (the rows it streamed go with its scoring session: `StepSampler.round` opens a new one for
        the new call)."""
        return self._call(version, RolloutRole.stream_sequences, on_rows, prompts, request, len(prompts))

    def _call(
        self,
        version: int,
        method: Callable[..., Any],
        on_item: Callable[[int, Any], None],
        rows: Batch,
        request: SamplingRequest,
        groups: int,
    ) -> Any:
        with self.replica_lock:
            try:
                self._hold(version)
                self.in_flight = groups
                return self.replicas.stream(method, on_item, rows, request)
            except WorkerError as e:
                if not e.died or self.stopping or not self.budget.allows():
                    raise
                self.budget.spend()
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
            self.route.deliver(self.replicas, version, published)
            self.replica_version = version
