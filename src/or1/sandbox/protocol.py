"""Host side of the runner protocol: limits, requests and replies, and a frame channel over any byte stream.

For the sandbox backends (local.py, docker_backend.py) and the code reward; the runner itself is runner.py.
"""

from __future__ import annotations

import json
import os
import select
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from or1.sandbox.runner import HEADER

RUNNER_PATH = Path(__file__).with_name("runner.py")
UID_BASE = int(os.environ.get("OR1_SANDBOX_UID_BASE", "2000000000"))  # far from users, nobody, subuid ranges
UID_SPAN = 100_000  # test uids are spread by host pid so two or1 processes rarely share a uid's process count
MAX_REPLY = 256 << 20  # a runner reply is capped output plus a little JSON; more means a broken runner
# seconds the host waits beyond a test's (or a batch's) time limit before it gives up on a runner
REPLY_SLACK = 10.0


def test_uids(slot: int) -> tuple[int, int]:
    """The (candidate, checker) uids of a slot: unprivileged, distinct, never root or a system account."""
    base = UID_BASE + 2 * ((os.getpid() * 64 + slot) % UID_SPAN)
    return base, base + 1


def is_test_uid(uid: int) -> bool:
    """True for any uid a sandbox test may run as (for host-side leak checks)."""
    return UID_BASE <= uid < UID_BASE + 2 * UID_SPAN


def runner_source() -> str:
    """The runner's source, passed to `python3 -c` so a sandbox never holds a stale copy."""
    return RUNNER_PATH.read_text()


class SandboxError(RuntimeError):
    """The sandbox itself failed (runner died, engine unreachable): the host scores internal_error, never 1."""


@dataclass(frozen=True)
class Limits:
    """Per-test resource limits applied inside the sandbox (rlimits per process, plus slot-wide caps)."""

    memory_mb: int = 1024  # RLIMIT_AS of each test process
    file_mb: int = 64  # RLIMIT_FSIZE: largest file a test may write
    open_files: int = 256  # RLIMIT_NOFILE
    processes: int = 32  # RLIMIT_NPROC for the test's uid: bounds fork bombs
    output_bytes: int = 32 << 20  # stdout / result cap; more is output_limit and the test is killed
    tmpfs_mb: int = 256  # size of the sandbox's writable /tmp
    slot_memory_mb: int = 3072  # cgroup memory cap for a whole slot (runner + all test processes)


@dataclass(frozen=True)
class TestRequest:
    """One test for the runner. kind: stdin (program reads `stdin`), call (`fn_name(*args)`), assert."""

    __test__ = False  # not a pytest class

    kind: str
    program: str
    timeout: float
    limits: Limits = field(default_factory=Limits)
    stdin: str = ""
    fn_name: str = ""
    args: list = field(default_factory=list)
    prefix: str = ""
    test_code: str = ""
    entry_point: str = ""

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class BatchRequest:
    """All tests of one program for one sandbox visit: run one after another, each in a fresh fork with its own
    timeout (`tests[i].timeout`; their `program` and `limits` are this batch's), within `budget` seconds in all."""

    program: str
    tests: list[TestRequest]
    budget: float
    limits: Limits = field(default_factory=Limits)

    def to_json(self) -> dict:
        tests = [{k: v for k, v in t.to_json().items() if k not in ("program", "limits")} for t in self.tests]
        limits = asdict(self.limits)
        return {
            "kind": "batch",
            "program": self.program,
            "limits": limits,
            "budget": self.budget,
            "tests": tests,
        }

    def wall_limit(self) -> float:
        """Seconds the whole batch may take in the runner: its tests' timeouts added up, at most the budget."""
        return min(sum(t.timeout for t in self.tests), self.budget)


@dataclass(frozen=True)
class TestReply:
    """What a test did. status: ok | runtime_error | timeout | output_limit | stopped (by the host) | internal."""

    __test__ = False  # not a pytest class

    status: str
    stdout: str = ""
    stderr: str = ""
    result: str = ""  # call: the JSON of the return value; assert: "PASS" when check() returned
    exit_code: int | None = None
    wall: float = 0.0

    @classmethod
    def from_json(cls, data: dict) -> TestReply:
        known = {
            k: data[k] for k in ("status", "stdout", "stderr", "result", "exit_code", "wall") if k in data
        }
        return cls(**known)


class FrameChannel:
    """Length-prefixed JSON frames over a writable fd and a readable byte source with deadlines."""

    def __init__(self, write_fd: int, read_fd: int):
        self.write_fd, self.read_fd = write_fd, read_fd
        self._buffer = bytearray()

    def send(self, message: dict) -> None:
        body = json.dumps(message).encode("utf-8")
        data = memoryview(HEADER.pack(len(body)) + body)
        while data:
            data = data[self._write(data) :]

    def recv(self, deadline: float) -> dict:
        (size,) = HEADER.unpack(self._take(HEADER.size, deadline))
        if size > MAX_REPLY:
            raise SandboxError(f"the sandbox runner sent a frame of {size} bytes")
        return json.loads(self._take(size, deadline).decode("utf-8"))

    def _write(self, data: memoryview) -> int:
        return os.write(self.write_fd, data)

    def _read_some(self, timeout: float) -> bytes:
        """Return some bytes (b"" at end of stream); raise TimeoutError when nothing came in time."""
        ready, _, _ = select.select([self.read_fd], [], [], max(timeout, 0))
        if not ready:
            raise TimeoutError
        return os.read(self.read_fd, 1 << 20)

    def _take(self, n: int, deadline: float) -> bytes:
        while len(self._buffer) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise SandboxError("the sandbox runner did not answer in time")
            try:
                chunk = self._read_some(left)
            except TimeoutError:
                continue
            if not chunk:
                raise SandboxError("the sandbox runner exited")
            self._buffer += chunk
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out


def stream_batch(
    channel: FrameChannel,
    batch: BatchRequest,
    keep_going: Callable[[int, TestReply], bool],
    replies: list[TestReply],
) -> list[TestReply]:
    """Send `batch` and collect one reply per test run into `replies`, in order, until the runner says done.

    `keep_going(index, reply)` judges each reply as it arrives; False sends the runner a stop (the host alone can
    tell a wrong output) and the replies after it are dropped. Raises SandboxError when the runner dies or does
    not finish within the batch's wall limit plus slack.
    """
    channel.send(batch.to_json())
    deadline = time.monotonic() + batch.wall_limit() + REPLY_SLACK
    stopped = False
    while True:
        frame = channel.recv(deadline)
        if "done" in frame:
            return replies
        if stopped:
            continue
        reply = TestReply.from_json(frame)
        replies.append(reply)
        if not keep_going(len(replies) - 1, reply):
            channel.send({"kind": "stop"})
            stopped = True
