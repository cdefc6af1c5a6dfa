"""Worker: the base class of everything that runs inside a worker group's Ray actors.

The WorkerGroup sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT in the process environment before
a Worker's `__init__` runs, so a subclass can call `self.init_distributed()` from its constructor. The same
environment works under torchrun, and the defaults make a Worker usable alone in one process (rank 0 of 1).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from or1.hybrid.dispatch import Dispatch, register

GPU_BACKEND = "cpu:gloo,cuda:nccl"  # one default group; each tensor's collective runs on its device's backend


class Worker:
    """Rank bookkeeping, torch.distributed setup and device choice shared by all roles.

    Subclasses add `@register(...)` methods; only registered methods are callable through a WorkerGroup.
    """

    @property
    def rank(self) -> int:
        return int(os.environ.get("RANK", "0"))

    @property
    def world_size(self) -> int:
        return int(os.environ.get("WORLD_SIZE", "1"))

    @property
    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    @property
    def master_addr(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def master_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "29500"))

    @property
    def device(self) -> torch.device:
        """This rank's device: its GPU when CUDA is visible, else the CPU."""
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # Ray shows each actor only its own GPU (index 0); torchrun shows all of a node's GPUs (index local_rank).
        return torch.device("cuda", self.local_rank % torch.cuda.device_count())

    def init_distributed(self, backend: str | None = None, timeout_s: float = 1800.0) -> None:
        """Join the default process group of this worker group (idempotent: colocated roles share one).

        backend None picks gloo on the CPU and, on a GPU, nccl for CUDA tensors with gloo beside it for CPU tensors
        (the engines' small bookkeeping collectives: token counts, metrics, flags). A collective that waits longer
        than timeout_s (e.g. a peer rank died) raises instead of hanging forever.
        """
        if dist.is_initialized():
            return
        device = self.device
        backend = backend or (GPU_BACKEND if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{self.master_addr}:{self.master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if "nccl" in backend else None,
        )

    def set_threads(self, n: int) -> None:
        """Limit this process's intra-op CPU threads (several ranks share a node's cores)."""
        if n < 1:
            raise ValueError(f"set_threads needs n >= 1, got {n}")
        os.environ["OMP_NUM_THREADS"] = str(n)  # read by libraries that start thread pools later
        torch.set_num_threads(n)

    @register(Dispatch.ONE_TO_ALL)
    def worker_info(self) -> dict[str, Any]:
        """Where this rank runs: for logs, debugging and colocation checks."""
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "local_rank": self.local_rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "device": str(self.device),
            "distributed": dist.is_initialized(),
        }
