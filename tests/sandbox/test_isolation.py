"""What a test program sees inside a slot, on each backend: the isolation properties the threat model promises."""

from __future__ import annotations

import json

from or1.sandbox.pool import SandboxPool
from or1.sandbox.protocol import TestRequest

PROBE = """
import json, os, resource, socket
cwd_files = os.listdir(".")
def writable(path):
    try:
        open(path, "w").close()
        return True
    except OSError:
        return False
limits = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n))[0] for n in ("AS", "NPROC", "FSIZE", "NOFILE", "CPU")}
print(json.dumps({
    "uid": os.getuid(), "euid": os.geteuid(), "env": dict(os.environ), "limits": limits,
    "interfaces": [name for _, name in socket.if_nameindex()],
    "root_writable": writable("/usr/or1-probe") or writable("/or1-probe"),
    "tmp_writable": any(writable(d + "/or1-probe") for d in ("/tmp", "/var/tmp", "/dev/shm", "/dev/mqueue", "/run")),
    "cwd_writable": writable("probe"),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "cwd_files": cwd_files,
}))
open("left-behind", "w").write("x")
"""


def _run(pool: SandboxPool, request: TestRequest):
    return pool.map([lambda sandbox: sandbox.run(request)])[0]


def test_program_runs_unprivileged_and_limited(pool: SandboxPool):
    reply = _run(pool, TestRequest("stdin", PROBE, 5))
    assert reply.status == "ok", reply.stderr
    seen = json.loads(reply.stdout)
    assert seen["uid"] >= 1000 and seen["euid"] == seen["uid"]
    assert set(seen["env"]) <= {"PATH", "HOME", "LANG", "TMPDIR"}
    assert seen["interfaces"] in ([], ["lo"])
    assert not seen["root_writable"] and not seen["tmp_writable"] and seen["cwd_writable"]
    assert seen["limits"]["AS"] == 1024 << 20 and seen["limits"]["NPROC"] == 32
    assert seen["limits"]["FSIZE"] == 64 << 20 and seen["limits"]["NOFILE"] == 256
    assert max(seen["pids"]) < 1000  # its own PID namespace: no host process is visible
    assert seen["cwd_files"] == []


def test_each_test_gets_a_fresh_directory(pool: SandboxPool):
    first = json.loads(_run(pool, TestRequest("stdin", PROBE, 5)).stdout)
    second = json.loads(_run(pool, TestRequest("stdin", PROBE, 5)).stdout)
    assert first["cwd_files"] == second["cwd_files"] == []


def test_stdout_is_capped_and_wall_clock_enforced(pool: SandboxPool):
    flood = _run(pool, TestRequest("stdin", "import os\nwhile True:\n    os.write(1, b'x' * 65536)", 5))
    assert flood.status == "output_limit" and flood.stdout == ""
    sleeper = _run(pool, TestRequest("stdin", "import time\ntime.sleep(30)", 0.5))
    assert sleeper.status == "timeout" and sleeper.wall < 2


def test_call_results_are_returned_as_json_text(pool: SandboxPool):
    program = "class Solution:\n    def f(self, a, b):\n        return {'sum': [a + b, (a, b)]}\n"
    reply = _run(pool, TestRequest("call", program, 5, fn_name="f", args=[1, 2]))
    assert reply.status == "ok" and json.loads(reply.result) == {"sum": [3, [1, 2]]}
