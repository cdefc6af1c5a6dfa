"""A persistent process pool whose workers are killed and replaced when a task runs past its timeout.

For verifiers that can hang (sympy on a hostile answer) and callers that cannot use SIGALRM (threads, threaded
or async Ray actors, subprocesses). `concurrent.futures` cannot do this: a timed-out future keeps its worker busy
forever. Here every worker is its own process with its own pipe; the parent waits on all pipes with a deadline,
and a worker past its deadline gets SIGKILL and a fresh replacement. Workers come from a 'forkserver' (default,
cheap replacements) or 'spawn' context, never 'fork', which is unsafe in processes that hold Ray or torch threads.

One `map` runs at a time per pool (a lock), so any thread may call it. Pools close at interpreter exit.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

OK, TIMEOUT, ERROR = "ok", "timeout", "error"
STARTUP_TIMEOUT = 120.0  # seconds a new worker may take to import and warm up before the pool gives up
_READY = "ready"


@dataclass(frozen=True)
class Outcome:
    """What became of one task: `status` is ok (then `value` is the return value), timeout or error; `seconds`
    is the wall time from handing it to a worker to its answer or kill."""

    status: str
    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def _mapped_bytes() -> int:
    """This process's current virtual memory size (0 where /proc is missing)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmSize:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _worker_main(conn: Connection, memory_mb: int | None, warmup: Callable[[], Any] | None) -> None:
    """Worker loop: run `(index, fn, args)` tasks from the pipe and send back `(index, ok, value or error)`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us cleanly
    if memory_mb:
        import resource

        # headroom on top of what the worker already maps (a re-imported main module may hold torch)
        limit = _mapped_bytes() + memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))  # a memory bomb raises MemoryError, not OOM
    if warmup is not None:
        warmup()
    conn.send(_READY)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent is gone
        if message is None:
            return
        index, fn, args = message
        try:
            reply = (index, True, fn(*args))
        except BaseException as err:  # noqa: B036 - a task error must never take the worker down silently
            reply = (index, False, f"{type(err).__name__}: {err}"[:500])
        try:
            conn.send(reply)
        except Exception as err:  # an unpicklable return value is the task's error, not the worker's
            conn.send((index, False, f"result not sendable: {type(err).__name__}"))


class _Worker:
    """One worker process, its pipe, and the task it is running (None when idle)."""

    def __init__(self, ctx: Any, memory_mb: int | None, warmup: Callable[[], Any] | None) -> None:
        parent, child = ctx.Pipe(duplex=True)
        self.proc = ctx.Process(target=_worker_main, args=(child, memory_mb, warmup), daemon=True)
        self.proc.start()
        child.close()
        self.conn: Connection = parent
        self.ready = False
        self.started = time.monotonic()
        self.task: int | None = None
        self.sent = 0.0  # when the current task was handed over
        self.deadline = 0.0

    def took(self) -> float:
        """Seconds since the current task was handed over."""
        return time.monotonic() - self.sent

    def kill(self) -> None:
        """SIGKILL the process and reap it; killing is the only stop that works on a hung sympy call."""
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


class ProcessPool:
    """`workers` persistent processes running tasks with a hard per-task timeout (see the module docstring).

    context: 'forkserver' or 'spawn'; both re-import the caller's main module in each worker, so scripts need the
    usual `if __name__ == "__main__":` guard, and a daemonic multiprocessing child cannot own a pool.
    memory_mb: address-space headroom per worker beyond its size at start (None: unlimited).
    warmup: run once in each new worker before it takes tasks, so start-up cost never eats a task's timeout.
    preload: modules the forkserver imports once, so replacement workers fork with them loaded.
    """

    def __init__(
        self,
        workers: int = 2,
        *,
        context: str = "forkserver",
        memory_mb: int | None = 2048,
        warmup: Callable[[], Any] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        if workers < 1:
            raise ValueError(f"a pool needs at least one worker, got {workers}")
        if context == "fork":
            raise ValueError(
                "the 'fork' context is unsafe in Ray/torch processes; use 'forkserver' or 'spawn'"
            )
        self.workers = workers
        self._ctx = mp.get_context(context)
        if context == "forkserver" and preload:
            self._ctx.set_forkserver_preload(list(preload))  # workers fork with these already imported
        self._memory_mb = memory_mb
        self._warmup = warmup
        self._lock = threading.Lock()
        self._slots: list[_Worker] = []
        self._pid = os.getpid()
        self._closed = False
        _LIVE_POOLS.add(self)

    def _start(self) -> _Worker:
        return _Worker(self._ctx, self._memory_mb, self._warmup)

    def _replace(self, slot: int) -> None:
        self._slots[slot].kill()
        self._slots[slot] = self._start()

    def start(self, *, wait: bool = False) -> None:
        """Start the worker processes now (they also start on the first map): their imports and warm-up then run
        in the background while the caller goes on, or, with `wait`, before this returns (for measurements that must
        not count a worker still warming up)."""
        with self._lock:
            self._ensure_workers()
            if wait:
                self._run(None, [], 0.0, until_ready=True)

    def _ensure_workers(self) -> None:
        if (
            self._pid != os.getpid()
        ):  # we are a forked child: those workers belong to the parent; leave them be
            self._slots, self._pid = [], os.getpid()
        while len(self._slots) < self.workers:
            self._slots.append(self._start())

    def map(
        self, fn: Callable[..., Any], args_list: Sequence[tuple[Any, ...]], *, timeout: float
    ) -> list[Outcome]:
        """Run `fn(*args)` for each args tuple (fn must be importable by name); ordered outcomes, each within timeout."""
        with self._lock:
            if self._closed:
                raise RuntimeError("this ProcessPool is closed")
            self._ensure_workers()
            return self._run(fn, args_list, timeout)

    def _run(
        self,
        fn: Callable[..., Any] | None,
        args_list: Sequence[tuple[Any, ...]],
        timeout: float,
        *,
        until_ready: bool = False,
    ) -> list[Outcome]:
        """Run the tasks to their outcomes; `until_ready`: also until every worker has started and warmed up."""
        results: list[Outcome | None] = [None] * len(args_list)
        queue = deque(range(len(args_list)))
        failed_starts = 0
        while (
            queue
            or any(w.task is not None for w in self._slots)
            or (until_ready and not all(w.ready for w in self._slots))
        ):
            self._dispatch(fn, args_list, queue, timeout)
            waiting = [w for w in self._slots if w.task is not None or not w.ready]
            now = time.monotonic()
            deadlines = [w.deadline for w in waiting if w.task is not None]
            deadlines += [w.started + STARTUP_TIMEOUT for w in waiting if not w.ready]
            ready = wait([w.conn for w in waiting], timeout=max(0.0, min(deadlines) - now))
            for slot, worker in enumerate(list(self._slots)):
                if worker.conn not in ready:
                    continue
                try:
                    message = worker.conn.recv()
                except (EOFError, OSError):
                    if worker.task is not None:
                        code = worker.proc.exitcode
                        results[worker.task] = Outcome(
                            ERROR, error=f"verifier process died (exit code {code})", seconds=worker.took()
                        )
                    else:
                        failed_starts += 1
                        if failed_starts > 3 * self.workers:
                            raise RuntimeError("pool workers keep dying before they are ready") from None
                    self._replace(slot)
                    continue
                if message == _READY:
                    worker.ready = True
                    continue
                index, ok, payload = message
                took = worker.took()
                results[index] = (
                    Outcome(OK, payload, seconds=took) if ok else Outcome(ERROR, error=payload, seconds=took)
                )
                worker.task = None
            self._expire(results)
        return [r if r is not None else Outcome(ERROR, error="task lost") for r in results]

    def _dispatch(
        self,
        fn: Callable[..., Any] | None,
        args_list: Sequence[tuple[Any, ...]],
        queue: deque[int],
        timeout: float,
    ) -> None:
        """Hand queued tasks to idle, ready workers; a worker that died idle is replaced and its task requeued."""
        for slot, worker in enumerate(self._slots):
            if not queue or not worker.ready or worker.task is not None:
                continue
            index = queue.popleft()
            try:
                worker.conn.send((index, fn, args_list[index]))
            except (OSError, ValueError):
                queue.appendleft(index)
                self._replace(slot)
                continue
            worker.sent = time.monotonic()
            worker.task, worker.deadline = index, worker.sent + timeout

    def _expire(self, results: list[Outcome | None]) -> None:
        """Kill and replace every worker past its task deadline; stuck startups are a bug and raise."""
        now = time.monotonic()
        for slot, worker in enumerate(self._slots):
            if worker.task is not None and now >= worker.deadline:
                results[worker.task] = Outcome(TIMEOUT, seconds=worker.took())
                self._replace(slot)
            elif not worker.ready and now >= worker.started + STARTUP_TIMEOUT:
                raise RuntimeError(f"a pool worker did not start within {STARTUP_TIMEOUT:.0f} s")

    def close(self) -> None:
        """Stop all workers (politely, then by force). The pool cannot be used afterwards."""
        with self._lock:
            self._closed = True
            if self._pid != os.getpid():
                return
            for worker in self._slots:
                try:
                    worker.conn.send(None)
                except (OSError, ValueError):
                    pass
            for worker in self._slots:
                worker.proc.join(1)
                worker.kill()
            self._slots = []

    def __enter__(self) -> ProcessPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LIVE_POOLS: weakref.WeakSet[ProcessPool] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    """Interpreter exit: stop every pool's workers so none outlives the process that owns it."""
    for pool in list(_LIVE_POOLS):
        pool.close()
