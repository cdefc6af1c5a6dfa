"""HybridFlow core: the Batch protocol, Worker base, dispatch modes, resource pools and Ray worker groups.

The names below load on first use: `or1 train` starts Ray through `or1.hybrid.cluster` (Ray only) while a thread
imports torch and the trainer, so importing this package must not pull torch in by itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_HOMES = {
    "Batch": "batch",
    "ray_session": "cluster",
    "Dispatch": "dispatch",
    "register": "dispatch",
    "ResourcePool": "resource_pool",
    "Worker": "worker",
    "WorkerError": "worker_group",
    "WorkerGroup": "worker_group",
    "colocate": "worker_group",
}

__all__ = [
    "Batch",
    "Dispatch",
    "ResourcePool",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "colocate",
    "ray_session",
    "register",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'or1.hybrid' has no attribute {name!r}")
    return getattr(importlib.import_module(f"or1.hybrid.{_HOMES[name]}"), name)


if TYPE_CHECKING:
    from or1.hybrid.batch import Batch
    from or1.hybrid.cluster import ray_session
    from or1.hybrid.dispatch import Dispatch, register
    from or1.hybrid.resource_pool import ResourcePool
    from or1.hybrid.worker import Worker
    from or1.hybrid.worker_group import WorkerError, WorkerGroup, colocate
