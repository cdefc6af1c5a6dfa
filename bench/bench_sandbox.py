"""Sandbox throughput: isolated test executions per second, and the overhead per execution against a plain
subprocess, on this machine's cores.

Usage: .venv/bin/python bench/bench_sandbox.py [--backend local|docker] [--slots 2] [--n 400]
Prints a table and one JSON line (for the bench README). Target: >= 80 trivial executions/s locally on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from or1.rewards.code import score_code_batch
from or1.sandbox.pool import SandboxPool
from or1.sandbox.protocol import TestRequest

TRIVIAL = "print(input())"
PYTHON = "/usr/bin/python3"  # the interpreter the sandbox runs, so both sides pay the same startup


def plain_once(_: int = 0) -> float:
    """One unisolated execution of the trivial program (what Skywork-OR1 did), in seconds."""
    start = time.perf_counter()
    subprocess.run(
        [PYTHON, "-I", "-S", "-c", TRIVIAL], input=b"x\n", capture_output=True, check=True, timeout=30
    )
    return time.perf_counter() - start


def plain_rate(n: int, workers: int) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(plain_once, range(n)))
    return n / (time.perf_counter() - start)


def isolated_rate(pool: SandboxPool, n: int) -> float:
    request = TestRequest("stdin", TRIVIAL, 6, stdin="x\n")

    def job(sandbox):
        reply = sandbox.run(request)
        assert reply.status == "ok" and reply.stdout == "x\n", reply
        return reply

    start = time.perf_counter()
    pool.map([job] * n)
    return n / (time.perf_counter() - start)


def isolated_latency(pool: SandboxPool, n: int) -> float:
    """Median seconds of one isolated execution, one at a time."""
    request = TestRequest("stdin", TRIVIAL, 6, stdin="x\n")
    times = []
    for _ in range(n):
        start = time.perf_counter()
        pool.map([lambda sandbox: sandbox.run(request)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def reward_rate(backend: str, slots: int, problems: int) -> float:
    """Tests per second through score_code_batch on stdin problems of 5 tests each."""
    gt = {"inputs": [f"{i} {i + 1}\n" for i in range(5)], "outputs": [f"{2 * i + 1}\n" for i in range(5)]}
    response = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    start = time.perf_counter()
    results = score_code_batch([response] * problems, [gt] * problems, slots=slots, backend=backend)
    assert all(r.score == 1.0 for r in results), results[:3]
    return 5 * problems / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="local", choices=["local", "docker"])
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--n", type=int, default=400, help="executions per measurement")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    pool = SandboxPool(args.backend, args.slots)
    startup = time.perf_counter() - start
    try:
        isolated_rate(pool, 20)  # warm-up
        iso = isolated_rate(pool, args.n)
        iso_latency = isolated_latency(pool, min(args.n, 100))
    finally:
        pool.close()
    plain = plain_rate(args.n, args.slots)
    plain_latency = statistics.median(plain_once() for _ in range(min(args.n, 100)))
    reward = reward_rate(args.backend, args.slots, max(args.n // 5, 10))
    out = {
        "backend": args.backend,
        "slots": args.slots,
        "cpus": os.cpu_count(),
        "n": args.n,
        "pool_startup_s": round(startup, 3),
        "isolated_exec_per_s": round(iso, 1),
        "plain_exec_per_s": round(plain, 1),
        "isolated_latency_ms": round(1000 * iso_latency, 2),
        "plain_latency_ms": round(1000 * plain_latency, 2),
        "overhead_ms": round(1000 * (iso_latency - plain_latency), 2),
        "reward_tests_per_s": round(reward, 1),
    }
    print(f"{'backend':28}{args.backend} ({args.slots} slots, {os.cpu_count()} CPUs)")
    print(f"{'pool startup':28}{startup:.2f} s")
    print(f"{'isolated executions/s':28}{iso:.1f}   (plain subprocess: {plain:.1f})")
    print(
        f"{'latency per execution':28}{1000 * iso_latency:.1f} ms   (plain subprocess: {1000 * plain_latency:.1f} ms)"
    )
    print(f"{'overhead per execution':28}{1000 * (iso_latency - plain_latency):+.1f} ms")
    print(f"{'score_code_batch tests/s':28}{reward:.1f}")
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
