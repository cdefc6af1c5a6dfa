"""ResourcePool: a fixed set of ranks (nodes x devices per node) reserved as Ray placement groups.

Rank r lives on node r // devices_per_node, with local rank r % devices_per_node. A node's ranks always share a
machine (fast intra-node collectives). When the cluster has at least `nnodes` machines that can each host a whole
node, the nodes are spread over distinct machines: one STRICT_SPREAD placement group with one bundle per node
(the resources of all its ranks; each rank actor takes its share of its node's bundle). Otherwise (one big machine
standing in for several nodes, as in tests) each node is its own STRICT_PACK placement group with one bundle per
rank, and several nodes may share a machine. A pool hosts one set of rank actors; several roles share it through
`colocate` (one process per rank), never two groups.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group

from or1.errors import UserError


@dataclass(frozen=True)
class Slot:
    """Where one rank goes: a placement group and the bundle within it."""

    placement_group: PlacementGroup
    bundle_index: int
    local_rank: int


class ResourcePool:
    """nnodes x devices_per_node ranks, each with one GPU (when use_gpu) and cpus_per_worker CPUs."""

    def __init__(
        self,
        nnodes: int,
        devices_per_node: int,
        use_gpu: bool,
        cpus_per_worker: float = 1,
        ready_timeout_s: float = 120.0,
    ) -> None:
        if nnodes < 1 or devices_per_node < 1:
            raise ValueError(
                f"ResourcePool needs nnodes >= 1 and devices_per_node >= 1, got {nnodes} x {devices_per_node}"
            )
        if cpus_per_worker <= 0:
            raise ValueError(f"ResourcePool needs cpus_per_worker > 0, got {cpus_per_worker}")
        self.nnodes = nnodes
        self.devices_per_node = devices_per_node
        self.use_gpu = use_gpu
        self.cpus_per_worker = cpus_per_worker
        self.ready_timeout_s = ready_timeout_s
        self._groups: list[PlacementGroup] = []
        self.spread = False  # True once reserved with one node per machine
        self.owner: str | None = None  # name of the worker group whose actors hold the bundles

    @property
    def world_size(self) -> int:
        return self.nnodes * self.devices_per_node

    def bundle(self) -> dict[str, float]:
        """Resources of one rank."""
        return {"CPU": self.cpus_per_worker, **({"GPU": 1} if self.use_gpu else {})}

    def slots(self) -> list[Slot]:
        """One Slot per rank in rank order; reserves the placement groups on first use."""
        if not self._groups:
            self._reserve()
        if self.spread:
            (pg,) = self._groups
            return [Slot(pg, n, i) for n in range(self.nnodes) for i in range(self.devices_per_node)]
        return [Slot(pg, i, i) for pg in self._groups for i in range(self.devices_per_node)]

    def release(self) -> None:
        """Give the reserved resources back to the cluster."""
        for pg in self._groups:
            remove_placement_group(pg)
        self._groups = []
        self.spread = False
        self.owner = None

    def node_bundle(self) -> dict[str, float]:
        """Resources of one node: all its ranks'."""
        return {k: v * self.devices_per_node for k, v in self.bundle().items()}

    def _reserve(self) -> None:
        hosts = self.check_cluster()
        self.spread = self.nnodes > 1 and hosts >= self.nnodes
        if self.spread:
            groups = [placement_group([self.node_bundle()] * self.nnodes, strategy="STRICT_SPREAD")]
        else:
            groups = [
                placement_group([self.bundle()] * self.devices_per_node, strategy="STRICT_PACK")
                for _ in range(self.nnodes)
            ]
        ready = [pg.ready() for pg in groups]
        done, _ = ray.wait(ready, num_returns=len(ready), timeout=self.ready_timeout_s)
        if len(done) < len(ready):
            for pg in groups:
                remove_placement_group(pg)
            raise UserError(
                f"the Ray cluster could not reserve {self.describe()} within {self.ready_timeout_s:.0f} s; "
                "other jobs may hold those resources (see `ray status`)"
            )
        self._groups = groups

    def check_cluster(self) -> int:
        """How many machines of the cluster can each host one node; fails with one sentence naming what is
        missing when the cluster can never host this pool."""
        per_node = self.node_bundle()
        alive = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        fits = [min(int(r.get(k, 0) // v) for k, v in per_node.items()) for r in alive]
        # A machine big enough for several of our "nodes" can host several placement groups.
        room = sum(fits)
        if room >= self.nnodes:
            return sum(1 for f in fits if f >= 1)
        largest = {k: max((r.get(k, 0) for r in alive), default=0) for k in per_node}
        short = [f"{v - largest[k]:g} {k}" for k, v in per_node.items() if largest[k] < v]
        missing = (
            f"the largest node lacks {', '.join(short)}" if short else f"room for {self.nnodes - room} more"
        )
        raise UserError(
            f"resource pool {self.describe()} needs {self.nnodes} node(s) with {_fmt(per_node)} each, but the Ray "
            f"cluster ({len(alive)} node(s), largest {_fmt(largest)}) has room for {room}; missing: {missing}. "
            "Add nodes, or lower nnodes / devices_per_node"
        )

    def describe(self) -> str:
        kind = "GPU" if self.use_gpu else "CPU worker"
        return f"{self.nnodes} node(s) x {self.devices_per_node} {kind}(s), {self.cpus_per_worker:g} CPU per rank"


def _fmt(resources: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in resources.items())
