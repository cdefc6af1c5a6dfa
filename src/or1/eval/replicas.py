"""Engine replicas on Ray for `or1 eval`: one rollout engine per actor, fed by outstanding work, replaced on death.

`plan_layout` decides how many replicas the devices allow: on GPUs, devices / tensor parallelism; on the CPU,
the cores shared out (each replica its own torch threads, so two replicas on two cores do not oversubscribe).
`ReplicaPool` starts one `EvalReplica` actor per replica and deals the evaluation's samples to them in chunks:
each replica holds at most IN_FLIGHT chunks, and the next chunk goes to the one with the fewest samples
outstanding, so a replica that drew long responses gets less rather than everyone waiting for it. Chunks shrink as
the queue empties, and once it is empty an idle replica also samples a copy of a chunk still queued behind a busy
one, so the last ones finish together. A replica that dies is started again and its chunks are sent again. Each
sample reaches the caller once: the first copy back counts, later ones are dropped. Each sample carries its
own seed, so the samples do not depend on the layout (see `or1.eval.generation`).
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from or1.engines.rollout import EngineSettings
from or1.errors import UserError
from or1.eval.generation import Completion, EngineBuild, Messages, engine_build, load_sampler
from or1.eval.protocols import EvalSampling
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
class _Replica:
    index: int
    handle: Any
    inflight: dict[Any, list[int]] = field(default_factory=dict)  # result ref -> positions in the work list

    @property
    def outstanding(self) -> int:
        return sum(len(chunk) for chunk in self.inflight.values())


class ReplicaPool:
    """`layout.replicas` EvalReplica actors over one model, each engine built with `settings` (Ray connected;
    layout.tensor_parallel_size is settings'); `run` deals work to them. `expected`: the build every replica must
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
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("ReplicaPool needs Ray connected (or1.hybrid.cluster.ray_session)")
        self.layout = layout
        self._args = (engine, str(model), sampling, settings)
        cpus = layout.threads * layout.tensor_parallel_size if not layout.gpus_per_replica else 1
        self._remote = ray.remote(EvalReplica).options(num_cpus=cpus, num_gpus=layout.gpus_per_replica)
        self.replicas = [self._start(i) for i in range(layout.replicas)]
        self.restarts = 0
        try:
            builds = [_get(ray_ref) for ray_ref in [r.handle.ready.remote() for r in self.replicas]]
        except BaseException:
            self.close()
            raise
        wrong = {b for b in builds if b != expected}
        if wrong:  # the samples are recorded under this process's build: the replicas must share it
            self.close()
            raise UserError(
                f"an eval replica runs {wrong.pop()}, this process {expected}; run or1 eval where the engines run "
                "or install the same versions on every node."
            )

    def _start(self, index: int) -> _Replica:
        cores = []
        if not self.layout.gpus_per_replica:
            per = self.layout.threads * self.layout.tensor_parallel_size
            count = os.cpu_count() or 1
            cores = [(index * per + i) % count for i in range(per)]
        return _Replica(index, self._remote.remote(*self._args, cores))

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
            refs = [ref for r in self.replicas for ref in r.inflight]
            (ready,), _ = ray.wait(refs, num_returns=1)
            replica = next(r for r in self.replicas if ready in r.inflight)
            positions = replica.inflight.pop(ready)
            try:
                completions = _get(ready)
            except RayActorError:
                lost = [p for p in positions + self._replace(replica) if p not in self._done]
                if not stopping:
                    queue.extendleft(reversed(lost))
                continue
            fresh = [(p, c) for p, c in zip(positions, completions, strict=True) if p not in self._done]
            self._done.update(p for p, _ in fresh)
            if fresh:
                on_done([p for p, _ in fresh], [c for _, c in fresh])
        if stop is not None:
            stop.raise_if_requested(f"stopped after {len(self._done)} of {len(requests)} samples")

    def _deal(
        self, queue: deque[int], requests: Sequence[Request], batch: int, *, backups: bool = True
    ) -> None:
        """Fill every replica up to IN_FLIGHT chunks, the least loaded first; chunks shrink as the queue empties.
        Once it is empty, an idle replica takes a copy of a chunk still waiting behind another replica's running
        one (the first copy back counts), so the tail never waits on the slowest replica's queue."""
        while queue:
            replica = min(self.replicas, key=lambda r: (len(r.inflight) >= IN_FLIGHT, r.outstanding, r.index))
            if len(replica.inflight) >= IN_FLIGHT:
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
        ref = replica.handle.generate.remote([requests[p] for p in positions])
        replica.inflight[ref] = positions

    def _replace(self, replica: _Replica) -> list[int]:
        """Start a new actor in a dead replica's place; returns the positions of its other chunks (lost too)."""
        self.restarts += 1
        if self.restarts > RESTARTS_PER_REPLICA * len(self.replicas):
            raise RuntimeError(f"eval replicas died {self.restarts} times; giving up (see the Ray logs)")
        lost = [p for chunk in replica.inflight.values() for p in chunk]
        ray.kill(replica.handle, no_restart=True)
        fresh = self._start(replica.index)
        self.replicas[self.replicas.index(replica)] = fresh
        return lost

    def close(self) -> None:
        for replica in self.replicas:
            ray.kill(replica.handle, no_restart=True)
        self.replicas = []


def _get(ref: Any) -> Any:
    """A replica's result; a UserError inside it becomes one line, a death stays RayActorError."""
    try:
        return ray.get(ref)
    except RayTaskError as err:
        if isinstance(getattr(err, "cause", None), UserError):
            raise UserError(f"{err.cause} (eval replica)") from None
        raise
