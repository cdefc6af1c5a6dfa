"""A program's tests in one sandbox visit: the same replies as one request per test, each test with its own limits
and a fresh process, the host able to stop the visit, and no test able to reach the next one."""

from __future__ import annotations

import time

import pytest

from or1.sandbox.pool import Sandbox, SandboxPool
from or1.sandbox.protocol import BatchRequest, TestReply, TestRequest

# One program, told by its input what to do: pass, print the wrong thing, crash, hang, flood stdout.
PROGRAM = """
import sys, time
what = input().strip()
if what == "crash":
    raise ValueError("boom")
if what == "hang":
    time.sleep(30)
if what == "flood":
    sys.stdout.write("x" * (40 << 20))
if what == "exit3":
    sys.exit(3)
print(what.upper())
"""
MIX = ["a", "b", "crash", "c", "hang", "exit3", "flood", "d"]


def _tests(inputs: list[str], timeout: float = 1.0) -> list[TestRequest]:
    return [TestRequest("stdin", "", timeout, stdin=f"{i}\n") for i in inputs]


def _on_slot(pool: SandboxPool, job):
    return pool.map([job])[0]


def _same(reply: TestReply) -> tuple:
    """What the host judges by (a killed test's stderr is cut wherever the kill landed)."""
    tail = reply.stderr.strip().splitlines()[-1:] if reply.status == "runtime_error" else []
    return (reply.status, reply.stdout, reply.result, reply.exit_code, tail)


def test_a_batch_answers_as_one_request_per_test(pool: SandboxPool):
    def both(sandbox: Sandbox) -> tuple[list[TestReply], list[TestReply]]:
        one_by_one = [
            sandbox.run(TestRequest("stdin", PROGRAM, t.timeout, stdin=t.stdin)) for t in _tests(MIX)
        ]
        batched = sandbox.run_batch(BatchRequest(PROGRAM, _tests(MIX), 60), lambda i, r: True)
        return one_by_one, batched

    one_by_one, batched = _on_slot(pool, both)
    assert [r.status for r in batched] == [
        "ok", "ok", "runtime_error", "ok", "timeout", "runtime_error", "output_limit", "ok",
    ]  # fmt: skip
    assert [_same(r) for r in batched] == [_same(r) for r in one_by_one]
    assert batched[0].stdout == "A\n" and "ValueError: boom" in batched[2].stderr
    assert 1.0 <= batched[4].wall < 2.0  # the hang got its own 1 s, not the batch's


@pytest.mark.parametrize("delay", [0.0, 0.3])
def test_the_host_stops_a_visit_and_the_test_then_running_is_killed(pool: SandboxPool, delay: float):
    def stop_after_first(reply_index: int, reply: TestReply) -> bool:
        time.sleep(delay)  # 0.3 s: the stop arrives while the hanging test runs; 0: whenever it lands
        return False

    def visit(sandbox: Sandbox) -> tuple[list[TestReply], float, TestReply]:
        start = time.monotonic()
        replies = sandbox.run_batch(
            BatchRequest(PROGRAM, _tests(["a", "hang", "b"], 20), 60), stop_after_first
        )
        took = time.monotonic() - start
        return replies, took, sandbox.run(TestRequest("stdin", PROGRAM, 5, stdin="after\n"))

    replies, took, after = _on_slot(pool, visit)
    assert [r.stdout for r in replies] == ["A\n"]
    assert took < 5  # the hanging second test (20 s limit) was killed by the stop, or never started
    assert after.stdout == "AFTER\n"  # the slot is in step with the host afterwards


def test_the_budget_caps_the_visit(pool: SandboxPool):
    tests = _tests(["hang", "hang", "hang", "a"], timeout=1.0)
    start = time.monotonic()
    replies = _on_slot(
        pool, lambda sandbox: sandbox.run_batch(BatchRequest(PROGRAM, tests, 1.5), lambda i, r: True)
    )
    assert time.monotonic() - start < 4
    assert [r.status for r in replies] == ["timeout", "timeout"]  # the second got the 0.5 s left; no third
    assert replies[1].wall < 1.0


POISON = """
import os, subprocess, sys
what = input().strip()
if what == "poison":
    open("left-behind", "w").write("x")
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    import builtins
    builtins.print = None
    for pid in (1, os.getppid()):
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    os._exit(0)
def alive(pid):
    return "Z (zombie)" not in open(f"/proc/{pid}/status").read()  # a killed daemon waits for init to reap it
mine = [p for p in os.listdir("/proc") if p.isdigit() and os.stat("/proc/" + p).st_uid == os.getuid() and alive(p)]
print(sorted(os.listdir(".")), len(mine))
"""


def test_a_test_that_poisons_its_slot_does_not_reach_the_next(pool: SandboxPool):
    tests = _tests(["poison", "check"], timeout=5.0)
    replies = _on_slot(
        pool, lambda sandbox: sandbox.run_batch(BatchRequest(POISON, tests, 60), lambda i, r: True)
    )
    assert [r.status for r in replies] == ["ok", "ok"], replies
    assert (
        replies[1].stdout == "[] 1\n"
    )  # a fresh work directory; no daemon left; only itself runs as the test uid


ASSERT_TEST = "def check(candidate):\n    assert candidate(1) == 1  # SECRET-{n}\n"
SNOOP = """
import gc
def f(x):
    seen = [str(o) for o in gc.get_objects() if isinstance(o, dict)]
    return 2 if any("SECRET-" in s for s in seen) else x
"""


def test_no_test_code_of_the_batch_reaches_the_candidate(pool: SandboxPool):
    tests = [
        TestRequest("assert", "", 5.0, test_code=ASSERT_TEST.format(n=n), entry_point="f", prefix="")
        for n in range(3)
    ]
    replies = _on_slot(
        pool, lambda sandbox: sandbox.run_batch(BatchRequest(SNOOP, tests, 60), lambda i, r: True)
    )
    assert [r.result for r in replies] == ["PASS"] * 3, replies
