"""How the separate placement's replicas get each version of the weights (rollout.weight_transfer).

A route publishes a version after its update (`publish`, the trainer's thread), puts the replicas on a version when
they are idle (`deliver`, under the placement's replica lock), and keeps the older versions a resume samples with in
a checkpoint (`save`, `load`):
- `Collective`: each training rank keeps its shard of the version on the host and sends it to the replicas over a
  gloo group (`or1.workers.weight_transfer`), in the ranks' aside threads, so the transfer runs while the trainer
  trains the next step; replicas that replaced dead ones join a new group and get again what they need.
- `ObjectStore`: every training rank gathers the whole model, rank 0 puts it in Ray's object store, every replica
  copies it out when it loads it (for replicas no group can reach).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from or1.config.schema import RunConfig
from or1.hybrid.worker_group import Pending, WorkerError, WorkerGroup
from or1.layout import ROLLOUT_WEIGHTS_FILE, rollout_weights_file
from or1.workers.rollout_worker import load_published, save_published

# What a version's publication hands the replicas' load_weights: (the weights' object, or None when they come by
# the group) and the push probe (None: no check)
Published = tuple[Any, Any]


class WeightRoute(Protocol):
    def publish(self, version: int, keep_from: int, replicas: WorkerGroup) -> Published: ...

    def deliver(self, replicas: WorkerGroup, version: int, published: Published) -> None: ...

    def save(self, versions: dict[int, Published], path: Path) -> None: ...

    def load(self, path: Path) -> dict[int, Published]: ...


def weight_route(cfg: RunConfig, actor: WorkerGroup) -> WeightRoute:
    if cfg.rollout.weight_transfer == "object_store":
        return ObjectStore(actor)
    return Collective(actor, cfg.rollout.weight_bucket_mb * 2**20)


class ObjectStore:
    """The whole model through Ray's object store (rollout.weight_transfer object_store)."""

    def __init__(self, actor: WorkerGroup) -> None:
        self.actor = actor

    def publish(self, version: int, keep_from: int, replicas: WorkerGroup) -> Published:
        return self.actor.publish_weights()[0]

    def deliver(self, replicas: WorkerGroup, version: int, published: Published) -> None:
        replicas.load_weights(version, published)

    def save(self, versions: dict[int, Published], path: Path) -> None:
        for version, (weights, _probe) in versions.items():
            save_published(weights, path / rollout_weights_file(version))

    def load(self, path: Path) -> dict[int, Published]:
        return {
            int(match.group(1)): (load_published(file), None)
            for file in path.iterdir()
            if (match := ROLLOUT_WEIGHTS_FILE.match(file.name))
        }


class Collective:
    """Each training rank's shard straight to the replicas over a gloo group (rollout.weight_transfer collective).

    One transfer runs at a time (the group's ranks take them in order); a version's transfer starts as it is
    published when the group holds the current replicas, else when the replicas need it."""

    def __init__(self, actor: WorkerGroup, bucket_bytes: int) -> None:
        self.actor, self.bucket_bytes = actor, bucket_bytes
        self.specs: list[Any] | None = None  # what a snapshot holds (`weight_transfer.layout`)
        self.joined: WorkerGroup | None = None  # the replicas the group holds
        self.transfers: dict[int, list[Pending]] = {}  # version -> its transfer to the joined replicas
        self.last: list[Pending] = []
        self.lock = threading.Lock()

    def publish(self, version: int, keep_from: int, replicas: WorkerGroup) -> Published:
        with self.lock:
            self._settle()  # the last transfer is done before its snapshot may be dropped
        probe = self.actor.snapshot_weights(version, keep_from)[0]
        with self.lock:
            if self.joined is replicas:
                try:
                    self._start(version)
                except (
                    RuntimeError
                ):  # the replicas were shut down meanwhile: their replacement is sent it anew
                    self.transfers.pop(version, None)
        return None, probe

    def deliver(self, replicas: WorkerGroup, version: int, published: Published) -> None:
        with self.lock:
            if self.joined is not replicas:
                self._join(replicas)
            transfer = self.transfers.get(version) or self._start(version)
        for pending in transfer:
            pending.result()
        replicas.load_weights(version, published)
        with self.lock:
            self.transfers = {v: t for v, t in self.transfers.items() if v > version}

    def save(self, versions: dict[int, Published], path: Path) -> None:
        self.actor.save_weight_snapshots(str(path), sorted(versions))

    def load(self, path: Path) -> dict[int, Published]:
        """The versions every training rank has a snapshot of (none from a checkpoint of another world size)."""
        found = [set(versions) for versions in self.actor.load_weight_snapshots(str(path))]
        return dict.fromkeys(set.intersection(*found), (None, None))

    def _join(self, replicas: WorkerGroup) -> None:
        """A new group: the training ranks and `replicas` (what was sent to earlier replicas is gone with them)."""
        self._settle()
        if self.specs is None:
            self.specs = self.actor.weight_layout()[0]
        host, port = self.actor.aside("weight_group_address").result()[0]
        world = self.actor.world_size + replicas.world_size
        joins = [
            self.actor.aside("join_weight_group", host, port, world),
            replicas.aside("join_weight_group", host, port, world, self.actor.world_size),
        ]
        for pending in joins:
            pending.result()
        self.joined, self.transfers = replicas, {}

    def _start(self, version: int) -> list[Pending]:
        self._settle()
        assert self.joined is not None
        args = (version, self.specs, self.bucket_bytes)
        receives = self.joined.aside(
            "receive_weights", *args
        )  # first: replicas shut down meanwhile raise here
        self.last = [self.actor.aside("send_weights", *args), receives]
        self.transfers[version] = self.last
        return self.last

    def _settle(self) -> None:
        """Wait for the last transfer; its failure (a replica that died) is its deliverer's to raise."""
        for pending in self.last:
            try:
                pending.result()
            except WorkerError:
                pass
        self.last = []
