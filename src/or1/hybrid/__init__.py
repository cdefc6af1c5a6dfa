"""HybridFlow core: the Batch protocol, Worker base, dispatch modes, resource pools and Ray worker groups."""

from or1.hybrid.batch import Batch
from or1.hybrid.cluster import ray_session
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.worker import Worker
from or1.hybrid.worker_group import Pending, WorkerError, WorkerGroup, colocate

__all__ = [
    "Batch",
    "Dispatch",
    "Pending",
    "ResourcePool",
    "Worker",
    "WorkerError",
    "WorkerGroup",
    "colocate",
    "ray_session",
    "register",
]
