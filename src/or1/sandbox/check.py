"""`or1 sandbox check`: a self-test of the configured sandbox backend, run on the user's own machine.

Runs the honest controls and every hostile probe of or1.sandbox.probes on a fresh pool, then checks that the host
is unchanged: no test process left, no file written outside, no connection to a host listener, an unrelated host
process still alive, and the pool still working afterwards. Judging a probe's output is not the sandbox's job: the
caller passes a `Judge` (the CLI passes the code reward's `or1.rewards.code.judge_probes`), and this module imports
nothing above the sandbox.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from or1.sandbox.pool import SandboxPool
from or1.sandbox.probes import Probe, controls, hostile, new_secret
from or1.sandbox.protocol import is_test_uid


class Verdict(Protocol):
    """What a judge says about one probe (an `or1.rewards.result.Result` is one)."""

    @property
    def score(self) -> float: ...
    @property
    def reason(self) -> str: ...
    @property
    def detail(self) -> str | None: ...


# Runs the probes on the pool's slots and judges each; one Verdict per probe, in order.
Judge = Callable[[SandboxPool, Sequence[Probe]], Sequence[Verdict]]


@dataclass(frozen=True)
class CheckResult:
    """One line of the self-test: what was checked, whether it held, and what was seen."""

    name: str
    passed: bool
    detail: str


def leftover_test_processes() -> list[str]:
    """Live host processes under any sandbox test uid, as "pid state cmd" (none once a test has been judged)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = dict(
                line.split(":", 1) for line in Path(f"/proc/{name}/status").read_text().splitlines()
            )
        except (OSError, ValueError):
            continue
        state = fields.get("State", "").split()[:1]
        if state in (["Z"], ["X"]):  # dead, only waiting for its init to reap it
            continue
        if any(is_test_uid(int(u)) for u in fields.get("Uid", "").split()):
            found.append(f"{name} {state} {fields.get('Name', '').strip()}")
    return found


class _Listener:
    """A TCP listener on the host's loopback that counts connections (a sandbox must never reach it)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(b"hello from the host\n")
            conn.close()

    def close(self) -> None:
        self.sock.close()


def run_self_test(judge: Judge, backend: str = "local", slots: int = 2) -> list[CheckResult]:
    """Run every control and hostile probe on a fresh `backend` pool; one CheckResult per probe and host check.

    `judge` runs the probes on the pool and scores them; a probe passes when its score is the one it wants.
    """
    secret = new_secret()
    checks: list[CheckResult] = []
    old_env = os.environ.get("OR1_CHECK_SECRET")
    with tempfile.TemporaryDirectory(prefix="or1-check-") as tmp:
        marker = os.path.join(tmp, "secret")
        Path(marker).write_text(secret + "\n")
        listener = _Listener()
        canary = subprocess.Popen(["sleep", "600"], start_new_session=True)  # an unrelated host process
        os.environ["OR1_CHECK_SECRET"] = secret  # in the host environment while the slots start
        try:
            pool = SandboxPool(backend, slots)
        finally:
            os.environ.pop("OR1_CHECK_SECRET") if old_env is None else os.environ.update(
                OR1_CHECK_SECRET=old_env
            )
        try:
            probes = controls() + hostile(listener.port, secret, marker)
            for probe, result in zip(probes, judge(pool, probes), strict=True):
                ok = result.score == probe.want
                checks.append(
                    CheckResult(probe.name, ok, f"score {result.score:g} ({result.reason}: {result.detail})")
                )
            again = judge(pool, controls()[:1])[0]
            checks.append(
                CheckResult("still_judges", again.score == 1.0, f"a control afterwards: {again.reason}")
            )
            left = leftover_test_processes()
            checks.append(
                CheckResult("no_test_processes", not left, f"left: {left}" if left else "none left")
            )
            written = [p for probe in probes for p in probe.leaves if os.path.exists(p)]
            checks.append(
                CheckResult("no_files_outside", not written, f"written: {written}" if written else "none")
            )
            checks.append(
                CheckResult("no_connections", listener.accepted == 0, f"{listener.accepted} accepted")
            )
            alive = canary.poll() is None
            checks.append(
                CheckResult("host_processes_alive", alive, "canary alive" if alive else "canary killed")
            )
        finally:
            pool.close()
            listener.close()
            canary.kill()
            canary.wait()
        left = leftover_test_processes()
        checks.append(
            CheckResult("clean_close", not left, f"left: {left}" if left else "nothing left after close")
        )
    return checks
