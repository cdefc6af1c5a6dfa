"""Engine replicas on Ray for `or1 eval`: one rollout engine per actor, fed by outstanding work, replaced on death.

`plan_layout` decides how many replicas the devices allow: on GPUs, devices / tensor parallelism; on the CPU,
the cores shared out (each replica its own torch threads, so two replicas on two cores do not oversubscribe).
`ReplicaPool` starts one `EvalReplica` actor per replica and deals the evaluation's samples to them in chunks.
Where the replicas share this machine's cores (the CPU, no Ray address), one of them runs in this process instead,
sampling on a thread of its own from the moment its model is loaded: the actors' start (each imports torch and
loads the model, seconds on the CPU) then overlaps with sampling instead of delaying all of it, and one process
fewer imports torch. An actor gets its chunks as soon as it is started and samples them once its engine is up; its
build is checked when its first chunk comes back. Each replica holds at most IN_FLIGHT chunks, and the next chunk
goes to the one with the fewest samples outstanding, so a replica that drew long responses gets less rather than
everyone waiting for it. Chunks shrink as the queue empties, and once it is empty an idle replica also samples a
copy of a chunk still queued behind a busy one, so the last ones finish together. A replica that dies is started
again and its chunks are sent again. Each sample reaches the caller once: the first copy back counts, later ones
are dropped. Each sample carries its own seed, so the samples do not depend on the layout (see
`or1.eval.generation`).
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from or1.engines.rollout import EngineSettings
from or1.errors import UserError
from or1.eval.generation import Completion, EngineBuild, Messages, engine_build, load_sampler
from or1.eval.protocols import EvalSampling
from or1.hybrid.actor_pool import Member, RestartBudget, first_results, kill, last_line, least_loaded, replace
from or1.stop import StopFlag

IN_FLIGHT = 2  # chunks a replica holds: the one it samples and the next, so it never idles
RESTARTS_PER_REPLICA = 3  # deaths a run tolerates per replica before it gives up

Request = tuple[Messages, int]  # (chat prompt, the sample's seed)


@dataclass(frozen=True)
class Layout:
    """How the evaluation's engines are laid out: `threads` torch threads per replica on the CPU (0 on GPUs)."""

    replicas: int
    tensor_parallel_size: int
    gpus_per_replica: int
    threads: int

    def to_dict(self) -> dict[str, int]:
        return {
            "replicas": self.replicas,
            "tensor_parallel_size": self.tensor_parallel_size,
            "gpus_per_replica": self.gpus_per_replica,
            "threads_per_replica": self.threads,
        }


def plan_layout(replicas: int | None, tensor_parallel_size: int, *, gpus: int, cpus: int) -> Layout:
    """The replicas the devices allow: `gpus` // TP with GPUs, else `cpus` // TP, each with its share of cores."""
    tp = tensor_parallel_size
    if tp < 1 or (replicas is not None and replicas < 1):
        raise UserError(f"--replicas and --tensor-parallel-size must be at least 1, got {replicas} and {tp}.")
    if gpus:
        most = gpus // tp
        if most < 1 or (replicas or most) > most:
            raise UserError(
                f"{replicas or 1} replica(s) x tensor parallelism {tp} need {(replicas or 1) * tp} GPUs; there are "
                f"{gpus}. Lower --replicas or --tensor-parallel-size."
            )
        return Layout(replicas or most, tp, tp, 0)
    count = replicas or max(1, cpus // tp)
    return Layout(count, tp, 0, max(1, cpus // (count * tp)))


class EvalReplica:
    """The body of one replica actor (the pool wraps it with `ray.remote`): one engine over the model."""

    def __init__(
        self, engine: str, model: str, sampling: EvalSampling, settings: EngineSettings, cores: list[int]
    ) -> None:
        if cores:  # the CPU: this replica's share of the cores, before any thread pool starts
            _use_cores(cores, settings.tensor_parallel_size)
        self.sample = load_sampler(engine, model, sampling, settings)
        self.build = engine_build(engine, settings)

    def ready(self) -> EngineBuild:
        return self.build

    def generate(self, requests: list[Request]) -> list[Completion]:
        return self.sample([prompt for prompt, _ in requests], [seed for _, seed in requests])


def _use_cores(cores: list[int], tensor_parallel_size: int) -> None:
    """Torch threads for this replica's share of the cores; with tensor parallelism (vLLM's ranks bind their
    threads within this process's cores) the replica is pinned to its share."""
    import torch

    if tensor_parallel_size > 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    threads = max(1, len(cores) // tensor_parallel_size)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch.set_num_threads(threads)


@dataclass(eq=False)
class _Replica(Member):
    """A member of the pool (its `inflight`: chunk future -> positions in the work list; `handle` None for the
    replica in this process)."""

    submit: Callable[[list[Request]], Future] = field(
        kw_only=True
    )  # sends a chunk; the future holds its completions
    ready: Future | None = field(
        default=None, kw_only=True
    )  # the actor's EngineBuild, until it has been checked


class ReplicaPool:
    """`layout.replicas` engines over one model, each built with `settings` (Ray connected;
    layout.tensor_parallel_size is settings'); `run` deals work to them. `local`: replica 0 runs in this process
    (CPU layouts on this machine); the others are EvalReplica actors. `expected`: the build every actor must
    report (the one the sample cache records)."""

    def __init__(
        self,
        engine: str,
        model: Path | str,
        sampling: EvalSampling,
        settings: EngineSettings,
        layout: Layout,
        *,
        expected: EngineBuild,
        local: bool = False,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("ReplicaPool needs Ray connected (or1.hybrid.cluster.ray_session)")
        self.layout, self.expected = layout, expected
        self.budget = RestartBudget(RESTARTS_PER_REPLICA * layout.replicas)
        self._args = (engine, str(model), sampling, settings)
        cpus = layout.threads * layout.tensor_parallel_size if not layout.gpus_per_replica else 1
        self._remote = ray.remote(EvalReplica).options(num_cpus=cpus, num_gpus=layout.gpus_per_replica)
        self._executor: ThreadPoolExecutor | None = None
        self._threads: int | None = None  # this process's torch threads before its replica took its share
        # the actors first: they import and load while this process loads its own engine
        self.replicas = [self._start(i) for i in range(int(local), layout.replicas)]
        if local:
            try:
                self.replicas.insert(0, self._start_here())
            except BaseException:
                self.close()
                raise

    def _start(self, index: int) -> _Replica:
        cores = []
        if not self.layout.gpus_per_replica:
            per = self.layout.threads * self.layout.tensor_parallel_size
            count = os.cpu_count() or 1
            cores = [(index * per + i) % count for i in range(per)]
        handle = self._remote.remote(*self._args, cores)
        return _Replica(
            index,
            submit=lambda requests: handle.generate.remote(requests).future(),
            handle=handle,
            ready=handle.ready.remote().future(),
        )

    def _start_here(self) -> _Replica:
        """Replica 0 in this process, with its share of the cores as torch threads while the pool lives (set
        before the engine loads: vLLM's CPU attention plans for the threads it sees then)."""
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(self.layout.threads)
        replica = EvalReplica(*self._args, cores=[])
        # OpenMP keeps a thread count per OS thread: the sampling thread sets its own
        self._executor = ThreadPoolExecutor(
            1, "or1-eval-replica", initializer=torch.set_num_threads, initargs=(self.layout.threads,)
        )
        return _Replica(0, submit=lambda requests: self._executor.submit(replica.generate, requests))

    def run(
        self,
        requests: Sequence[Request],
        on_done: Callable[[list[int], list[Completion]], None],
        *,
        batch: int,
        stop: StopFlag | None = None,
    ) -> None:
        """Sample every request; `on_done(positions, completions)` as each chunk comes back, each position once. A
        stop request lets the chunks in flight finish (and reach on_done), then raises."""
        queue: deque[int] = deque(range(len(requests)))
        self._done: set[int] = set()
        self._copied: set[tuple[int, ...]] = set()
        stopping = False
        while len(self._done) < len(requests) and (queue or any(r.inflight for r in self.replicas)):
            if stop is not None and stop.requested and not stopping:
                stopping = True
                queue.clear()
            self._deal(queue, requests, batch, backups=not stopping)
            chunks = [chunk for r in self.replicas for chunk in r.inflight]
            if not chunks:  # stopped before anything was dealt (Ctrl-C while the replicas start)
                break
            ready = next(iter(wait(chunks, return_when=FIRST_COMPLETED).done))
            replica = next(r for r in self.replicas if ready in r.inflight)
            positions = replica.inflight.pop(ready)
            try:
                self._check(replica)
                completions = _result(ready)
            except RayActorError as death:
                if death.actor_init_failed:  # not a lost replica: its engine cannot start
                    raise UserError(f"an eval replica failed to start: {last_line(death)}") from None
                lost = [p for p in positions + self._replace(replica) if p not in self._done]
                if not stopping:
                    queue.extendleft(reversed(lost))
                continue
            first = set(first_results(positions, self._done))
            fresh = [(p, c) for p, c in zip(positions, completions, strict=True) if p in first]
            if fresh:
                on_done([p for p, _ in fresh], [c for _, c in fresh])
        if stop is not None:
            stop.raise_if_requested(f"stopped after {len(self._done)} of {len(requests)} samples")

    def _check(self, replica: _Replica) -> None:
        """An actor's first chunk counts only if it runs this process's build (the one the samples are recorded
        under); its `ready` answered before the chunk did, an actor runs its calls in order."""
        if replica.ready is None:
            return
        build = _result(replica.ready)
        if build != self.expected:
            raise UserError(
                f"an eval replica runs {build}, this process {self.expected}; run or1 eval where the engines run "
                "or install the same versions on every node."
            )
        replica.ready = None

    def _deal(
        self, queue: deque[int], requests: Sequence[Request], batch: int, *, backups: bool = True
    ) -> None:
        """Fill every replica up to IN_FLIGHT chunks, the least loaded first; chunks shrink as the queue empties.
        Once it is empty, an idle replica takes a copy of a chunk still waiting behind another replica's running
        one (the first copy back counts), so the tail never waits on the slowest replica's queue."""
        while queue:
            replica = least_loaded(self.replicas, IN_FLIGHT)
            if replica is None:
                return
            size = max(1, min(batch, math.ceil(len(queue) / (IN_FLIGHT * len(self.replicas)))))
            self._send(replica, [queue.popleft() for _ in range(min(size, len(queue)))], requests)
        for idle in [r for r in self.replicas if not r.inflight] if backups else []:
            waiting = [
                [p for p in chunk if p not in self._done]
                for r in self.replicas
                for chunk in list(r.inflight.values())[1:]  # behind the chunk the replica is sampling
                if tuple(chunk) not in self._copied
            ]
            waiting = [chunk for chunk in waiting if chunk]
            if not waiting:
                return
            chunk = max(waiting, key=len)
            self._copied.add(tuple(chunk))
            self._send(idle, chunk, requests)

    def _send(self, replica: _Replica, positions: list[int], requests: Sequence[Request]) -> None:
        replica.inflight[replica.submit([requests[p] for p in positions])] = positions

    def _replace(self, replica: _Replica) -> list[int]:
        """Start a new actor in a dead replica's place; returns the positions of its other chunks (lost too)."""
        lost = replace(self.replicas, replica, self._start, self.budget, "eval replicas")
        return [p for chunk in lost for p in chunk]

    @property
    def restarts(self) -> int:
        """Replicas started in a dead one's place so far."""
        return self.budget.used

    def close(self) -> None:
        """Kill the actors; the replica in this process finishes the chunk it samples, if any."""
        for replica in self.replicas:
            kill(replica)
        self.replicas = []
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
            self._executor = None
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
            self._threads = None


def _result(future: Future) -> Any:
    """A replica's result; a UserError inside it becomes one line, a death stays RayActorError."""
    try:
        return future.result()
    except RayTaskError as err:
        if isinstance(getattr(err, "cause", None), UserError):
            raise UserError(f"{err.cause} (eval replica)") from None
        raise
