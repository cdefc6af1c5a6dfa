"""Local backend: one warm runner per slot inside bubblewrap (no network, read-only /usr, private /tmp, new PID
namespace, empty environment, minimal capabilities), optionally in a cgroup that caps the slot's memory and pids.

For the code reward on a machine without a container engine. Needs root: tests run under unprivileged uids of their
own (RLIMIT_NPROC binds only non-root uids, and a test sharing the runner's uid could trace it and forge a pass).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from or1.errors import UserError
from or1.sandbox.cgroup import SlotCgroup
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

PYTHON = "/usr/bin/python3"  # the system interpreter: the project's venv stays outside the sandbox
# Capabilities the runner keeps (tests lose them all when they change uid): switch uids, kill tests, clean /tmp.
RUNNER_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_CHOWN")


def bwrap_path() -> str:
    """The bubblewrap binary, or a UserError that says how to install it or that root is needed."""
    path = shutil.which("bwrap")
    if path is None:
        raise UserError("the local sandbox needs bubblewrap: install it with `apt-get install bubblewrap`")
    if os.geteuid() != 0:
        raise UserError(
            "the local sandbox runs tests under their own uids and needs root; use --backend docker"
        )
    return path


def _hidden_modules() -> list[str]:
    """Interpreter extension modules untrusted code must not load (ctypes gives raw memory access)."""
    lib = Path("/usr/lib")
    return [str(p) for p in lib.glob("python3*/lib-dynload/_ctypes*.so")]


def bwrap_command(limits: Limits, uids: tuple[int, int]) -> list[str]:
    """The bubblewrap command line that starts one runner."""
    cmd = [
        bwrap_path(),
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
    ]
    cmd += ["--cap-drop", "ALL"] + [a for cap in RUNNER_CAPS for a in ("--cap-add", cap)]
    cmd += ["--die-with-parent", "--new-session", "--ro-bind", "/usr", "/usr", "--tmpfs", "/usr/local"]
    for link in ("bin", "sbin", "lib", "lib64"):
        if os.path.islink(f"/{link}"):
            cmd += ["--symlink", os.readlink(f"/{link}"), f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            cmd += ["--ro-bind", f"/{link}", f"/{link}"]
    for module in _hidden_modules():
        cmd += ["--ro-bind", "/dev/null", module]
    cmd += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmpfs_mb << 20), "--tmpfs", "/tmp"]
    cmd += [
        "--clearenv",
        "--setenv",
        "PATH",
        "/usr/bin:/bin",
        "--setenv",
        "LANG",
        "C.UTF-8",
        "--chdir",
        "/tmp",
    ]
    cmd += [PYTHON, "-I", "-S", "-c", runner_source(), "--serve", str(uids[0]), str(uids[1])]
    return cmd


class LocalSandbox:
    """One slot: a bubblewrap'd runner process that judges tests sent over its stdin/stdout."""

    def __init__(self, slot: int = 0, limits: Limits | None = None):
        self.limits = limits or Limits()
        self.uids = test_uids(slot)
        self.cgroup = SlotCgroup.create(f"or1-{os.getpid()}-{slot}-{time.monotonic_ns()}", self.limits)
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}
        self._start()

    def _start(self) -> None:
        cmd = bwrap_command(self.limits, self.uids)
        if self.cgroup is not None:
            cmd = self.cgroup.wrap(cmd)
        self.proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin"},
            start_new_session=True,
        )
        self.channel = FrameChannel(self.proc.stdin.fileno(), self.proc.stdout.fileno())
        try:
            self.info = self.channel.recv(time.monotonic() + 30)
            if not self.info.get("ready"):
                raise SandboxError(str(self.info.get("error")))
        except SandboxError as exc:
            err = (
                self.proc.stderr.read().decode(errors="replace").strip()
                if self.proc.poll() is not None
                else ""
            )
            self.close()
            raise SandboxError(f"the local sandbox did not start: {err or exc}") from exc

    def run(self, request: TestRequest) -> TestReply:
        """Judge one test; a dead or stuck runner is restarted and the test reported as internal."""
        if self.proc is None or self.proc.poll() is not None:
            self._restart()
        try:
            self.channel.send(request.to_json())
            return TestReply.from_json(self.channel.recv(time.monotonic() + request.timeout + REPLY_SLACK))
        except (SandboxError, OSError) as exc:
            self._restart()
            return TestReply(status="internal", stderr=str(exc))

    def run_batch(self, batch: BatchRequest, keep_going: Callable[[int, TestReply], bool]) -> list[TestReply]:
        """Run a program's tests in one visit (see `stream_batch`); a dead or stuck runner is restarted and the
        test it was on reported as internal."""
        if self.proc is None or self.proc.poll() is not None:
            self._restart()
        replies: list[TestReply] = []
        try:
            return stream_batch(self.channel, batch, keep_going, replies)
        except (SandboxError, OSError) as exc:
            self._restart()
            return [*replies, TestReply(status="internal", stderr=str(exc))]

    def _restart(self) -> None:
        self._stop()
        self._start()

    def _stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # bwrap is PID 1 of the sandbox: its death kills every test process
            self.proc.wait()
            for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                stream.close()
            self.proc = None

    def close(self) -> None:
        """Stop the runner and remove the slot's cgroup; nothing of the slot remains."""
        self._stop()
        if self.cgroup is not None:
            self.cgroup.remove()
            self.cgroup = None
