"""`or1 sandbox check`: a self-test of the configured sandbox backend, run on the user's own machine.

Scores the honest controls and every hostile probe of or1.sandbox.probes through the real code reward on a fresh
pool, then checks that the host is unchanged: no test process left, no file written outside, no connection to a
host listener, an unrelated host process still alive, and the pool still judging correctly afterwards.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from or1.sandbox.pool import SandboxPool
from or1.sandbox.probes import Probe, controls, hostile, new_secret
from or1.sandbox.protocol import is_test_uid


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


def _score(pool: SandboxPool, probes: list[Probe]) -> list:
    from or1.rewards.code import prepare_problem, score_program

    def job(probe: Probe):
        prepared = prepare_problem(probe.response, probe.ground_truth)
        if not isinstance(prepared, tuple):
            return lambda sandbox: prepared
        return lambda sandbox: score_program(*prepared, sandbox, timeout=probe.timeout)

    return pool.map([job(p) for p in probes])


def run_self_test(backend: str = "local", slots: int = 2) -> list[CheckResult]:
    """Run every control and hostile probe on a fresh `backend` pool; one CheckResult per probe and host check."""
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
            for probe, result in zip(probes, _score(pool, probes), strict=True):
                ok = result.score == probe.want
                checks.append(
                    CheckResult(probe.name, ok, f"score {result.score:g} ({result.reason}: {result.detail})")
                )
            again = _score(pool, controls()[:1])[0]
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
