"""Docker backend: one long-lived container per slot, through the Docker API (any engine: DOCKER_HOST).

For machines with a container engine, or for users who want the engine's isolation instead of bubblewrap. Each slot
is a container of the image built from sandbox/ (no network, read-only root, a tmpfs /tmp, memory / pids / CPU
limits, no-new-privileges, six capabilities, our runner's `--init` as PID 1 to reap orphans). The runner is started
in it with one `exec` whose hijacked socket carries the same frames as the local backend; each test is judged by
that runner under unprivileged test uids. `close` removes the container and with it every process and file.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time
from collections.abc import Callable

from or1.errors import UserError
from or1.sandbox.protocol import (
    REPLY_SLACK,
    BatchRequest,
    FrameChannel,
    Limits,
    SandboxError,
    TestReply,
    TestRequest,
    runner_source,
    stream_batch,
    test_uids,
)

IMAGE = os.environ.get("OR1_SANDBOX_IMAGE", "or1-sandbox:latest")
LABEL = "or1.sandbox"
RUNNER_CAPS = ["SETUID", "SETGID", "KILL", "CHOWN", "DAC_OVERRIDE", "FOWNER"]
_STREAM = struct.Struct(">BxxxL")  # Docker's multiplexed stream header: stream id, 3 pad bytes, length


def docker_client():
    """A Docker SDK client for DOCKER_HOST (or the default socket), or a UserError saying how to get one."""
    try:
        import docker
    except ImportError:
        raise UserError("the docker backend needs the docker SDK: pip install docker") from None
    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except Exception as exc:  # the SDK raises several unrelated types for "no engine"
        raise UserError(
            f"no Docker-API engine reachable (set DOCKER_HOST; see sandbox/ci-engine.sh): {exc}"
        ) from None
    return client


def engine_reachable() -> bool:
    """True when a Docker-API engine answers and the sandbox image exists (the docker-marked tests need both)."""
    try:
        docker_client().images.get(IMAGE)
    except Exception:
        return False
    return True


def remove_orphans(client) -> int:
    """Remove slot containers that an or1 process on this host left behind when it was killed; their count."""
    removed = 0
    for container in client.containers.list(all=True, filters={"label": LABEL}):
        host, _, rest = container.labels.get("or1.owner", "").partition(":")
        pid = rest.partition(":")[0]
        if host == socket.gethostname() and pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            try:
                container.remove(force=True)
                removed += 1
            except Exception:  # another process removed it first
                pass
    return removed


class _ExecChannel(FrameChannel):
    """Frames over a hijacked exec socket: writes go to the runner's stdin, reads demultiplex its stdout."""

    def __init__(self, sock: socket.socket):
        super().__init__(sock.fileno(), sock.fileno())
        self.sock = sock
        self._raw = bytearray()

    def _write(self, data: memoryview) -> int:
        return self.sock.send(data)

    def _read_some(self, timeout: float) -> bytes:
        while True:
            if len(self._raw) >= _STREAM.size:
                stream, size = _STREAM.unpack_from(self._raw)
                if len(self._raw) >= _STREAM.size + size:
                    payload = bytes(self._raw[_STREAM.size : _STREAM.size + size])
                    del self._raw[: _STREAM.size + size]
                    if stream == 1:  # stdout carries frames; stderr (runner crashes) is dropped
                        return payload
                    continue
            ready, _, _ = select.select([self.sock], [], [], max(timeout, 0))
            if not ready:
                raise TimeoutError
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                return b""
            self._raw += chunk


class DockerSandbox:
    """One slot: a warm container with a runner exec'd into it, judging tests sent over the exec socket."""

    def __init__(self, slot: int = 0, limits: Limits | None = None, image: str = IMAGE):
        self.limits = limits or Limits()
        self.uids = test_uids(slot)
        self.client = docker_client()
        if slot == 0:
            remove_orphans(self.client)
        self.container = None
        self._sock: socket.socket | None = None
        self._hijacked = None
        try:
            self.container = self.client.containers.run(image, **self._container_options(slot))
            self._start_runner()
        except BaseException:
            self.close()
            raise

    def _container_options(self, slot: int) -> dict:
        memory = f"{self.limits.slot_memory_mb}m"
        return {
            "command": ["/usr/bin/python3", "-I", "-S", "-c", runner_source(), "--init"],
            "detach": True,
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": f"size={self.limits.tmpfs_mb}m,mode=755"},
            "mem_limit": memory,
            "memswap_limit": memory,  # no swap: the memory cap is real
            "pids_limit": 2 * self.limits.processes + 16,
            "nano_cpus": 1_000_000_000,  # one CPU per slot
            "cap_drop": ["ALL"],
            "cap_add": RUNNER_CAPS,
            "security_opt": ["no-new-privileges"],
            "user": "0:0",  # the runner switches to the test uids itself
            "environment": {},
            "working_dir": "/tmp",
            "labels": {LABEL: "1", "or1.owner": f"{socket.gethostname()}:{os.getpid()}:{slot}"},
        }

    def _start_runner(self) -> None:
        cmd = ["/usr/bin/python3", "-I", "-S", "-c", runner_source(), "--serve", *map(str, self.uids)]
        exec_id = self.client.api.exec_create(self.container.id, cmd, stdin=True, stdout=True, stderr=True)[
            "Id"
        ]
        self._hijacked = self.client.api.exec_start(exec_id, socket=True)
        self._sock = getattr(self._hijacked, "_sock", self._hijacked)
        self._sock.setblocking(True)
        self.channel = _ExecChannel(self._sock)
        info = self.channel.recv(time.monotonic() + 60)
        if not info.get("ready"):
            raise SandboxError(f"the docker sandbox runner did not start: {info.get('error')}")

    def run(self, request: TestRequest) -> TestReply:
        """Judge one test; a dead runner or container is replaced and the test reported as internal."""
        try:
            if self._sock is None:
                self._restart()
            self.channel.send(request.to_json())
            return TestReply.from_json(self.channel.recv(time.monotonic() + request.timeout + REPLY_SLACK))
        except Exception as exc:  # engine and socket errors alike: never a pass
            return self._failed(exc)

    def run_batch(self, batch: BatchRequest, keep_going: Callable[[int, TestReply], bool]) -> list[TestReply]:
        """Run a program's tests in one visit (see `stream_batch`); a dead runner or container is replaced and the
        test it was on reported as internal."""
        replies: list[TestReply] = []
        try:
            if self._sock is None:
                self._restart()
            return stream_batch(self.channel, batch, keep_going, replies)
        except Exception as exc:  # engine and socket errors alike: never a pass
            return [*replies, self._failed(exc)]

    def _failed(self, exc: Exception) -> TestReply:
        """Replace the runner after `exc` and report the test it was on as internal."""
        try:
            self._restart()
        except Exception as again:
            self._sock = None
            return TestReply(status="internal", stderr=f"{exc}; restart failed: {again}")
        return TestReply(status="internal", stderr=str(exc))

    def _restart(self) -> None:
        self._close_socket()
        self.container.reload()
        if self.container.status != "running":
            raise SandboxError(f"the slot's container is {self.container.status}")
        self._sweep_runners()
        self._start_runner()

    def _sweep_runners(self) -> None:
        """Stop a previous runner and its tests: restart the container's processes from its init."""
        self.container.restart(timeout=0)

    def _close_socket(self) -> None:
        if self._sock is not None:
            for stream in (
                self._hijacked,
                self._sock,
            ):  # the SDK's wrapper holds the fd open until it closes too
                try:
                    stream.close()
                except OSError:
                    pass
            self._sock = self._hijacked = None

    def close(self) -> None:
        """Remove the container: its processes and its tmpfs go with it."""
        self._close_socket()
        if self.container is not None:
            try:
                self.container.remove(force=True)
            except Exception:  # already gone
                pass
            self.container = None
