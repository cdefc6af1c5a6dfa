"""WorkerGroup: the controller's handle on one role running in one Ray actor per rank.

`group.method(*args)` looks up the method's registered Dispatch, splits the call across ranks, runs it on every
rank's actor and collects the results. `colocate` puts several roles (e.g. actor_rollout and critic) in the same
actor process per rank, so they can share devices and hand tensors over in memory; each role still gets its own
WorkerGroup handle with its own dispatch.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import ray
from ray import ObjectRefGenerator
from ray.exceptions import RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from or1.errors import UserError
from or1.hybrid.actor_pool import last_line
from or1.hybrid.dispatch import Dispatch, collect, method_spec, split_call
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.worker import Worker

Roles = Mapping[str, tuple[type[Worker], dict[str, Any]]]
# A rank actor's second thread: calls that run beside the one in progress (`WorkerGroup.aside`)
ASIDE = "aside"


class WorkerError(RuntimeError):
    """A worker failed (raised, or its process died: `died`); names the group, rank and method."""

    def __init__(self, group: str, rank: int, method: str, detail: str, *, died: bool = False) -> None:
        super().__init__(f"worker group {group!r} rank {rank} failed in {method}(): {detail}")
        self.group, self.rank, self.method, self.detail, self.died = group, rank, method, detail, died


def free_address() -> tuple[str, int]:
    """This node's IP and a port free right now (for a rendezvous this process serves)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return ray.util.get_node_ip_address(), port


class RankActor:
    """The Ray actor of one rank: hosts one instance of each colocated role and routes calls to it."""

    def address(self) -> tuple[str, int]:
        """This node's IP and a port free right now, for rank 0 to serve torch.distributed's rendezvous."""
        return free_address()

    def setup(self, env: dict[str, str], roles: dict[str, tuple[type[Worker], dict[str, Any]]]) -> None:
        """Set the rank environment, then construct every role (their __init__ may already use it)."""
        os.environ.update(env)
        self.roles = {role: cls(**kwargs) for role, (cls, kwargs) in roles.items()}

    def call(self, role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return getattr(self.roles[role], method)(*args, **kwargs)

    def stream(self, role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[Any]:
        """A generator method's items, each sent to the controller as it is yielded (a Ray streaming call)."""
        yield from getattr(self.roles[role], method)(*args, **kwargs)

    @ray.method(concurrency_group=ASIDE)
    def call_aside(self, role: str, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """`call` in the actor's aside thread: it runs beside the call in progress (one aside call at a time)."""
        return getattr(self.roles[role], method)(*args, **kwargs)


_RemoteRankActor = ray.remote(concurrency_groups={ASIDE: 1})(RankActor)

# How long a rank's failure waits for Ray to report a peer's death: a killed rank's peers fail in their collective
# (a gloo "connection reset") often before Ray sees the process gone.
PEER_DEATH_GRACE_S = 10.0


def wait_all(group: str, method: str, refs: list[ray.ObjectRef], timeout_s: float | None = None) -> list[Any]:
    """Per-rank results in rank order; raises on the first failure, not after the slowest rank (a failure other
    than a death first waits up to PEER_DEATH_GRACE_S for a peer's death, its likely cause)."""
    rank_of = {ref: rank for rank, ref in enumerate(refs)}
    results: dict[int, Any] = {}
    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1, timeout=timeout_s)
        if not done:
            raise WorkerError(group, rank_of[pending[0]], method, f"no result within {timeout_s} s")
        rank = rank_of[done[0]]
        with _blaming_a_dead_peer(group, method, {ref: rank_of[ref] for ref in pending}):
            results[rank] = _get(group, rank, method, done[0])
    return [results[r] for r in range(len(refs))]


@contextmanager
def _blaming_a_dead_peer(group: str, method: str, peers: dict[Any, int]) -> Iterator[None]:
    """Turn a rank's failure into its peer's death where a peer (a pending ref or stream) died: that is the cause,
    and the failure a restart answers (`died`)."""
    try:
        yield
    except WorkerError as err:
        if err.died:
            raise
        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        pending = list(peers)
        while pending and (left := deadline - time.monotonic()) > 0:
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                break
            ready = done[0]
            stream = isinstance(ready, ObjectRefGenerator)
            try:
                ray.get(next(ready) if stream else ready)
            except RayActorError as e:
                detail = (
                    f"its actor process died ({type(e).__name__}); rank {err.rank} then failed: {err.detail}"
                )
                raise WorkerError(group, peers[ready], method, detail, died=True) from e
            except Exception:  # noqa: BLE001 - another failure, or a stream's end: not a death
                continue
            if stream:  # a stream that yielded an item may still end in its process's death
                pending.append(ready)
        raise


def _get(group: str, rank: int, method: str, ref: ray.ObjectRef) -> Any:
    """One rank's result; its failure as a one-line UserError (the user's to fix) or a WorkerError."""
    try:
        return ray.get(ref)
    except RayTaskError as e:
        if isinstance(getattr(e, "cause", None), UserError):  # the user's to fix: one line, no restart
            raise UserError(f"{e.cause} (worker group {group!r} rank {rank}, {method}())") from None
        raise WorkerError(group, rank, method, last_line(str(e))) from e
    except RayActorError as e:
        detail = f"its actor process died ({type(e).__name__})"
        raise WorkerError(group, rank, method, detail, died=True) from e


class WorkerGroup:
    """One role on every rank of a ResourcePool; registered methods are called as attributes."""

    def __init__(
        self,
        pool: ResourcePool,
        worker_cls: type[Worker],
        *,
        init_kwargs: dict[str, Any] | None = None,
        name: str,
        env: dict[str, str] | None = None,
    ) -> None:
        actors = _RankActors.spawn(pool, {name: (worker_cls, dict(init_kwargs or {}))}, name, env)
        self._bind(actors, name, name, worker_cls)

    @classmethod
    def _handle(cls, actors: _RankActors, name: str, role: str, worker_cls: type[Worker]) -> WorkerGroup:
        group = cls.__new__(cls)
        group._bind(actors, name, role, worker_cls)
        return group

    def _bind(self, actors: _RankActors, name: str, role: str, worker_cls: type[Worker]) -> None:
        self._actors, self.name, self._role, self.worker_cls = actors, name, role, worker_cls
        self.pool = actors.pool

    @property
    def world_size(self) -> int:
        return len(self._actors.handles)

    def __getattr__(self, method: str) -> Callable[..., Any]:
        if method.startswith("_") or "worker_cls" not in self.__dict__:  # private, or not yet bound
            raise AttributeError(method)
        if not hasattr(self.worker_cls, method):
            raise AttributeError(
                f"worker group {self.name!r} ({self.worker_cls.__name__}) has no method {method!r}"
            )
        spec = method_spec(self.worker_cls, method)
        if spec is None:
            raise AttributeError(
                f"{self.worker_cls.__name__}.{method} is not marked @register(...); only registered methods "
                f"can be called through worker group {self.name!r}"
            )

        dispatch = spec.dispatch

        def call(*args: Any, **kwargs: Any) -> Any:
            # Run `method` on every rank and collect; the first rank to fail raises WorkerError without waiting for
            # its peers, which may be stuck (see `wait_all`).
            self._actors.check_alive(self.name, method)
            split = split_call(dispatch, self.world_size, args, kwargs)
            if dispatch is Dispatch.ONE_TO_ALL:
                # Identical arguments: store them once, every rank reads the same object.
                shared = [ray.put(args), ray.put(kwargs)]
                refs = [a.call.remote(self._role, method, *shared) for a in self._actors.handles]
            else:
                refs = [
                    a.call.remote(self._role, method, c.args, c.kwargs)
                    for a, c in zip(self._actors.handles, split.calls, strict=True)
                ]
            results = wait_all(self.name, method, refs)
            try:
                return collect(dispatch, results, split)
            except ValueError as e:  # e.g. per-rank Batches whose meta disagree
                raise ValueError(
                    f"worker group {self.name!r}: cannot collect the results of {method}(): {e}"
                ) from e

        call.__name__ = method
        call.__doc__ = getattr(self.worker_cls, method).__doc__
        return call

    def aside(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        """Start the ONE_TO_ALL `method` on every rank in its aside thread, beside whatever the rank is running (a
        weights transfer while the trainer trains or a replica samples); `.result()` waits for it."""
        spec = method_spec(self.worker_cls, method)
        if spec is None or spec.dispatch is not Dispatch.ONE_TO_ALL:
            raise AttributeError(f"{self.worker_cls.__name__}.{method} is not a registered ONE_TO_ALL method")
        self._actors.check_alive(self.name, method)
        shared = [ray.put(args), ray.put(kwargs)]
        return Pending(
            self.name,
            method,
            [a.call_aside.remote(self._role, method, *shared) for a in self._actors.handles],
        )

    def stream(
        self,
        method: Callable[..., Iterator[Any]],
        on_item: Callable[[int, Any], None],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Run the generator `method` (a registered method of the group's worker class, e.g.
        `RolloutRole.stream_sequences`) on every rank: `on_item(rank, item)` for each item as it arrives, but the
        last item of each rank, which is that rank's result, collected as a plain call's would be."""
        name = method.__name__
        if getattr(self.worker_cls, name, None) is not method:
            raise AttributeError(f"{method.__qualname__} is not a method of {self.worker_cls.__name__}")
        spec = method_spec(self.worker_cls, name)
        if spec is None:
            raise AttributeError(f"{self.worker_cls.__name__}.{name} is not marked @register(...)")
        self._actors.check_alive(self.name, name)
        split = split_call(spec.dispatch, self.world_size, args, kwargs)
        rank_of = {
            a.stream.options(num_returns="streaming").remote(self._role, name, c.args, c.kwargs): rank
            for rank, (a, c) in enumerate(zip(self._actors.handles, split.calls, strict=True))
        }
        last: dict[int, Any] = {}
        pending = list(rank_of)
        while pending:
            (ready,), pending = ray.wait(pending, num_returns=1)
            rank = rank_of[ready]
            try:
                ref = next(ready)
            except StopIteration:
                continue
            with _blaming_a_dead_peer(self.name, name, {g: rank_of[g] for g in pending}):
                item = _get(self.name, rank, name, ref)
            if rank in last:  # an earlier item is a progress item only once another follows it
                on_item(rank, last[rank])
            last[rank] = item
            pending.append(ready)
        missing = [rank for rank in range(self.world_size) if rank not in last]
        if missing:
            raise WorkerError(self.name, missing[0], name, "its generator yielded nothing")
        return collect(spec.dispatch, [last[r] for r in range(self.world_size)], split)

    def shutdown(self) -> None:
        """Kill the rank actors and release the pool (colocated roles share actors: this ends all of them)."""
        self._actors.shutdown()

    def __repr__(self) -> str:
        return f"WorkerGroup({self.name!r}, {self.worker_cls.__name__}, world_size={self.world_size})"


class Pending:
    """A call running on every rank of a group (`WorkerGroup.aside`)."""

    def __init__(self, group: str, method: str, refs: list[ray.ObjectRef]) -> None:
        self.group, self.method, self.refs = group, method, refs

    def result(self) -> list[Any]:
        """Every rank's result in rank order (a failure raises as a plain call's does)."""
        return wait_all(self.group, self.method, self.refs)


def colocate(
    pool: ResourcePool, roles: Roles, name: str, env: dict[str, str] | None = None
) -> dict[str, WorkerGroup]:
    """Run several roles in one actor process per rank; returns one WorkerGroup handle per role."""
    if not roles:
        raise ValueError("colocate needs at least one role")
    actors = _RankActors.spawn(pool, {r: (cls, dict(kw)) for r, (cls, kw) in roles.items()}, name, env)
    return {
        role: WorkerGroup._handle(actors, f"{name}/{role}", role, cls) for role, (cls, _) in roles.items()
    }


class _RankActors:
    """The actors of one pool, shared by the WorkerGroup handles of the roles they host."""

    def __init__(self, pool: ResourcePool, handles: list[Any], name: str) -> None:
        self.pool, self.handles, self.name, self.closed = pool, handles, name, False

    @classmethod
    def spawn(
        cls,
        pool: ResourcePool,
        roles: dict[str, tuple[type[Worker], dict[str, Any]]],
        name: str,
        env: dict[str, str] | None,
    ) -> _RankActors:
        if pool.owner is not None:
            raise ValueError(
                f"resource pool already hosts worker group {pool.owner!r}; put roles that share devices in one "
                "colocate(...) call, or give this group its own pool"
            )
        slots = pool.slots()
        pool.owner = name
        options = {"num_cpus": pool.cpus_per_worker, "num_gpus": 1 if pool.use_gpu else 0}
        handles = [
            _RemoteRankActor.options(
                **options,
                scheduling_strategy=PlacementGroupSchedulingStrategy(s.placement_group, s.bundle_index),
            ).remote()
            for s in slots
        ]
        actors = cls(pool, handles, name)
        try:
            addr, port = wait_all(name, "address", [handles[0].address.remote()])[0]
            world = len(handles)
            setups = [
                h.setup.remote(
                    {
                        **(env or {}),
                        "RANK": str(r),
                        "WORLD_SIZE": str(world),
                        "LOCAL_RANK": str(s.local_rank),
                        "MASTER_ADDR": addr,
                        "MASTER_PORT": str(port),
                    },
                    roles,
                )
                for r, (h, s) in enumerate(zip(handles, slots, strict=True))
            ]
            wait_all(name, "__init__", setups)  # all constructors run at once: they may rendezvous
        except BaseException:
            actors.shutdown()
            raise
        return actors

    def check_alive(self, group: str, method: str) -> None:
        if self.closed:
            raise RuntimeError(f"worker group {group!r} was shut down; cannot call {method}()")

    def shutdown(self) -> None:
        if self.closed:
            return
        for h in self.handles:
            ray.kill(h, no_restart=True)
        self.pool.release()
        self.closed = True
