"""Sandbox throughput: the code reward's tests per second against plain, unisolated subprocess executions, on this
machine's cores, for the local backend and (when an engine is reachable) the docker one.

Usage: .venv/bin/python bench/bench_sandbox.py [--backends local,docker] [--slots 2] [--n 400] [--rounds 3]
Per backend and round: plain subprocess executions/s (what Skywork-OR1 did, `python3 -c` per test), isolated
executions/s (one trivial test per request through a warm pool), and `score_code_batch` tests/s on stdin problems
of 5 tests each (all tests of a problem in one sandbox visit; the pool warmed first). Prints a table, the median
ratio score_code_batch / plain against its target (3x local, 2x docker) and one JSON line per backend.
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
from or1.sandbox.pool import SandboxPool, close_pools, unavailable
from or1.sandbox.protocol import TestRequest

TRIVIAL = "print(input())"
PYTHON = "/usr/bin/python3"  # the interpreter the sandbox runs, so both sides pay the same startup
TESTS_PER_PROBLEM = 5
TARGETS = {"local": 3.0, "docker": 2.0}  # score_code_batch tests/s over plain executions/s (issue 28)
PROBLEM = {
    "inputs": [f"{i} {i + 1}\n" for i in range(TESTS_PER_PROBLEM)],
    "outputs": [f"{2 * i + 1}\n" for i in range(TESTS_PER_PROBLEM)],
}
RESPONSE = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def plain_once(_: int = 0) -> float:
    """One unisolated execution of the trivial program, in seconds."""
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
    """Trivial tests per second, one request per test, through the warm pool."""
    request = TestRequest("stdin", TRIVIAL, 6, stdin="x\n")

    def job(sandbox):
        reply = sandbox.run(request)
        assert reply.status == "ok" and reply.stdout == "x\n", reply
        return reply

    start = time.perf_counter()
    pool.map([job] * n)
    return n / (time.perf_counter() - start)


def reward_rate(backend: str, slots: int, problems: int) -> float:
    """Tests per second through score_code_batch (its pool already warm)."""
    start = time.perf_counter()
    results = score_code_batch([RESPONSE] * problems, [PROBLEM] * problems, slots=slots, backend=backend)
    seconds = time.perf_counter() - start
    assert all(r.score == 1.0 for r in results), results[:3]
    return TESTS_PER_PROBLEM * problems / seconds


def measure(backend: str, slots: int, n: int, rounds: int) -> dict:
    """Median rates of `rounds` rounds (plain, isolated, score_code_batch in turn) and the median ratio."""
    start = time.perf_counter()
    pool = SandboxPool(backend, slots)
    startup = time.perf_counter() - start
    problems = max(n // TESTS_PER_PROBLEM, 10)
    score_code_batch([RESPONSE] * slots, [PROBLEM] * slots, slots=slots, backend=backend)  # start its pool
    plain, iso, reward = [], [], []
    try:
        isolated_rate(pool, 20)  # warm-up
        for _ in range(rounds):
            plain.append(plain_rate(n, slots))
            iso.append(isolated_rate(pool, n))
            reward.append(reward_rate(backend, slots, problems))
    finally:
        pool.close()
        close_pools()
    ratios = [r / p for r, p in zip(reward, plain, strict=True)]
    return {
        "backend": backend,
        "slots": slots,
        "cpus": os.cpu_count(),
        "n": n,
        "rounds": rounds,
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "pool_startup_s": round(startup, 3),
        "plain_exec_per_s": round(statistics.median(plain), 1),
        "isolated_exec_per_s": round(statistics.median(iso), 1),
        "reward_tests_per_s": round(statistics.median(reward), 1),
        "ratio_reward_over_plain": round(statistics.median(ratios), 2),
        "ratios": [round(r, 2) for r in ratios],
        "target": TARGETS[backend],
    }


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backends", default="local,docker", help="comma-separated; unavailable ones are skipped"
    )
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--n", type=int, default=400, help="executions (and tests) per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    outs = []
    for backend in args.backends.split(","):
        reason = unavailable(backend)
        if reason:
            print(f"{backend}: skipped ({reason})")
            continue
        out = measure(backend, args.slots, args.n, args.rounds)
        met = "met" if out["ratio_reward_over_plain"] >= out["target"] else "NOT met"
        load = out["load_average"]
        print(
            f"{backend} ({args.slots} slots, {out['cpus']} CPUs, load {load}), medians of {args.rounds} rounds:"
        )
        rows = [
            ("plain subprocess executions/s", f"{out['plain_exec_per_s']:.1f}"),
            ("isolated executions/s", f"{out['isolated_exec_per_s']:.1f}   (one request per test)"),
            (
                "score_code_batch tests/s",
                f"{out['reward_tests_per_s']:.1f}   ({TESTS_PER_PROBLEM} tests a problem)",
            ),
            (
                "score_code_batch / plain",
                f"{out['ratio_reward_over_plain']:.2f}x   (rounds {out['ratios']}; target {out['target']:g}x: {met})",
            ),
        ]
        for name, value in rows:
            print(f"  {name:34}{value}")
        print(json.dumps(out))
        outs.append(out)
    return outs


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
