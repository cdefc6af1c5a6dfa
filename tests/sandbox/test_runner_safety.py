"""The runner's cleanup must only ever touch test processes: the regression test for the crash that killed every
process on a CI machine when `kill(-1, SIGKILL)` ran outside a PID namespace."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import or1.sandbox.runner as runner

# Runs in its own PID namespace, so even a regressed sweep cannot reach the test runner: a root canary and a
# process under a test uid are started, then the sweep runs as if the runner were loose on the host.
SWEEP_SCRIPT = """
import os, subprocess, sys, time
sys.path.insert(0, {src!r})
from or1.sandbox import runner
canary = subprocess.Popen(["sleep", "30"])
victim = subprocess.Popen(["sleep", "30"], user=61000, group=61000, start_new_session=True)
time.sleep(0.2)
runner._sweep({{61000, 61001}}, [])
time.sleep(0.1)
print("canary", "alive" if canary.poll() is None else "dead")
print("victim", "alive" if victim.poll() is None else "dead")
canary.kill()
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_sweep_kills_test_uids_only():
    src = str(Path(runner.__file__).parents[2])
    script = SWEEP_SCRIPT.format(src=src)
    cmd = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", script]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, start_new_session=True)
    assert out.returncode == 0, out.stderr
    assert "canary alive" in out.stdout and "victim dead" in out.stdout, out.stdout


def test_sweep_refuses_root_and_own_uid():
    with pytest.raises(RuntimeError):
        runner._sweep({0, 61000}, [])
    with pytest.raises(RuntimeError):
        runner._sweep({os.getuid(), 61000}, [])


def test_runner_never_signals_groups_or_everyone():
    calls = [n for n in ast.walk(ast.parse(Path(runner.__file__).read_text())) if isinstance(n, ast.Call)]
    names = {getattr(c.func, "attr", getattr(c.func, "id", "")): c for c in calls}
    assert "killpg" not in names
    for call in calls:
        if getattr(call.func, "attr", "") == "kill":
            first = call.args[0]
            assert not isinstance(first, ast.UnaryOp) and not (
                isinstance(first, ast.Constant) and first.value <= 0
            )


def test_runner_refuses_to_serve_without_distinct_test_uids():
    env = {"PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-I", "-S", runner.__file__, "--serve", "61000", "61000"]
    out = subprocess.run(cmd, input=b"", capture_output=True, timeout=30, env=env, start_new_session=True)
    assert b'"ready": false' in out.stdout
