"""A warm pool of sandbox slots that runs many problems' tests concurrently and returns results in order.

For the code reward and `or1 sandbox check`. Each slot is one sandbox (a bubblewrap'd runner or a container) that
runs one test, or one program's tests, at a time; `map` hands each job a free slot. Pools are cached per (backend,
slots) so training steps reuse warm slots, and every pool is closed at interpreter exit: no process, container or
file stays behind.
"""

from __future__ import annotations

import atexit
import os
import queue
import shutil
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from or1.errors import UserError
from or1.sandbox.protocol import BatchRequest, Limits, TestReply, TestRequest

T = TypeVar("T")
BACKENDS = ("local", "docker")


class Sandbox(Protocol):
    """One slot: runs a test, or a program's tests in one visit, and can be closed (all its processes, containers
    and files removed)."""

    def run(self, request: TestRequest) -> TestReply: ...

    def run_batch(
        self, batch: BatchRequest, keep_going: Callable[[int, TestReply], bool]
    ) -> list[TestReply]: ...

    def close(self) -> None: ...


def open_sandbox(backend: str, slot: int, limits: Limits) -> Sandbox:
    """Start one slot of `backend` ("local" or "docker")."""
    if backend == "local":
        from or1.sandbox.local import LocalSandbox

        return LocalSandbox(slot, limits)
    if backend == "docker":
        from or1.sandbox.docker_backend import DockerSandbox

        return DockerSandbox(slot, limits)
    raise UserError(f"unknown sandbox backend {backend!r}: choose one of {', '.join(BACKENDS)}")


def unavailable(backend: str) -> str | None:
    """Why `backend` cannot run on this machine (one sentence naming the fix), or None when it can."""
    if backend == "local":
        if shutil.which("bwrap") is None:
            return "bubblewrap is not installed (apt-get install bubblewrap)"
        if os.geteuid() != 0:
            return "the local backend needs root (tests run under their own unprivileged uids)"
        return None
    if backend == "docker":
        from or1.sandbox.docker_backend import IMAGE, engine_reachable

        if not engine_reachable():
            return f"no Docker-API engine with image {IMAGE}: run sandbox/ci-engine.sh and export DOCKER_HOST"
        return None
    return f"unknown sandbox backend {backend!r}: choose one of {', '.join(BACKENDS)}"


class SandboxPool:
    """`slots` warm sandboxes of one backend; `map` runs jobs on them, at most one job per slot at a time."""

    def __init__(self, backend: str, slots: int, limits: Limits | None = None):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.backend, self.slots, self.limits = backend, slots, limits or Limits()
        self._free: queue.Queue[Sandbox] = queue.Queue()
        self._all: list[Sandbox] = []
        self._lock = threading.Lock()
        self._executor = ThreadPoolExecutor(slots, thread_name_prefix=f"or1-sandbox-{backend}")
        try:
            # opened on the pool's own threads, which live as long as the pool: bwrap's --die-with-parent is per thread
            for sandbox in self._executor.map(lambda i: open_sandbox(backend, i, self.limits), range(slots)):
                self._all.append(sandbox)
                self._free.put(sandbox)
        except BaseException:
            self.close()
            raise

    def _on_free_slot(self, job: Callable[[Sandbox], T]) -> T:
        sandbox = self._free.get()
        try:
            return job(sandbox)
        finally:
            self._free.put(sandbox)

    def map(self, jobs: Sequence[Callable[[Sandbox], T]]) -> list[T]:
        """Run every job on some free slot; results in the order of `jobs` (a job's exception is re-raised)."""
        with self._lock:
            return list(self._executor.map(self._on_free_slot, jobs))

    def close(self) -> None:
        """Stop every slot; the pool cannot be used afterwards."""
        self._executor.shutdown(wait=True)
        for sandbox in self._all:
            sandbox.close()
        self._all.clear()


_POOLS: dict[tuple[str, int], SandboxPool] = {}
_POOLS_LOCK = threading.Lock()


def get_pool(backend: str, slots: int) -> SandboxPool:
    """The process-wide pool for (backend, slots), started on first use and reused afterwards."""
    if backend not in BACKENDS:
        raise UserError(f"unknown sandbox backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    with _POOLS_LOCK:
        pool = _POOLS.get((backend, slots))
        if pool is None:
            pool = _POOLS[(backend, slots)] = SandboxPool(backend, slots)
        return pool


@atexit.register
def close_pools() -> None:
    """Close every cached pool (also runs at interpreter exit)."""
    with _POOLS_LOCK:
        for pool in _POOLS.values():
            pool.close()
        _POOLS.clear()
