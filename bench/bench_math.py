"""Math reward throughput: or1's score_batch (pool, hard timeouts) vs math-verify called plainly in one process.

The mix: AIME24/25 and MATH-500 golds from the OR1_BENCHMARKS folder, each with responses that are right and wrong in
several spellings, behind a reasoning prefix. Prints verifications/second of both, their ratio, and how many of
the mix each judged as labelled. Run from the repository root:

    .venv/bin/python bench/bench_math.py [--workers 2] [--timeout 5] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import sys
import time
from pathlib import Path

# The benchmark folder or1 reads (OR1_BENCHMARKS, as in or1.data.benchmarks); else the shared files beside a checkout.
BENCHMARKS = Path(
    os.environ.get("OR1_BENCHMARKS") or Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
)
THINKING = (
    "<think>\nLet me set up the problem. "
    + "We expand, collect terms and check the cases. " * 40
    + "\n</think>\n"
)


def _golds() -> list[str]:
    """AIME golds (zero-padded, one with a degree sign) and MATH-500 answers; empty when the files are absent."""
    from or1.rewards.normalize import parse_ground_truth

    golds: list[str] = []
    for name in ("aime24/aime24.jsonl", "aime25/aime25.jsonl"):
        path = BENCHMARKS / name
        if path.is_file():
            for line in path.read_text().splitlines():
                golds += parse_ground_truth(json.loads(line)["reward_model"]["ground_truth"])
    math500 = BENCHMARKS / "math500" / "math500.jsonl"
    if math500.is_file():
        golds += [json.loads(line)["answer"] for line in math500.read_text().splitlines()]
    return golds


def _wrong(gold: str, rng: random.Random) -> str:
    """A plausible wrong answer: one digit changed, or a different integer."""
    units = re.search(
        r"\\(?:mbox|text)", gold
    )  # a changed unit exponent (cm^2 -> cm^7) is not a wrong answer
    digits = [m.start() for m in re.finditer(r"\d", gold[: units.start() if units else len(gold)])]
    if not digits:
        return gold + "+1"
    at = rng.choice(digits)
    return gold[:at] + str((int(gold[at]) + rng.randint(1, 8)) % 10) + gold[at + 1 :]


def build_mix(seed: int = 0) -> list[tuple[str, str, bool]]:
    """(response, ground_truth JSON, is_right) triples: right and wrong answers in several forms per gold."""
    rng = random.Random(seed)
    mix = []
    for gold in _golds():
        gt = json.dumps([gold])
        integer = re.fullmatch(r"0*(\d+)(\^\\circ)?", gold)
        right = [
            f"\\boxed{{{gold}}}",
            f"So the answer is $\\boxed{{{gold.replace(chr(92) + 'frac', chr(92) + 'dfrac')}}}$.",
        ]
        if integer:
            right += [f"\\boxed{{{int(integer.group(1))}}}", f"The final answer is {int(integer.group(1))}."]
        wrong = [f"\\boxed{{{_wrong(gold, rng)}}}", "I could not finish the computation."]
        mix += [(THINKING + r, gt, True) for r in right] + [(THINKING + w, gt, False) for w in wrong]
    rng.shuffle(mix)
    return mix


def run_plain(mix: list[tuple[str, str, bool]]) -> tuple[float, int]:
    """math-verify as Skywork-OR1 calls it: gold wrapped in \\boxed, whole response parsed, default timeouts."""
    from math_verify import parse, verify

    agree = 0
    started = time.perf_counter()
    for response, gt, right in mix:
        gold = json.loads(gt)[0]
        agree += verify(parse("\\boxed{" + gold + "}"), parse(response)) == right
    return time.perf_counter() - started, agree


def run_or1(mix: list[tuple[str, str, bool]], workers: int, timeout: float) -> tuple[float, int]:
    """or1's score_batch over the whole mix (one call, as a training step makes), pool already warm."""
    from or1.rewards.score import math_pool, score_batch

    rows = [{"ability": "math", "response": r, "reward_model": {"ground_truth": gt}} for r, gt, _ in mix]
    math_pool(workers).start(wait=True)  # every worker warmed up outside the timing, as in a running trainer
    started = time.perf_counter()
    results = score_batch(rows, workers=workers, timeout=timeout)
    seconds = time.perf_counter() - started
    return seconds, sum(r.correct == right for r, (_, _, right) in zip(results, mix, strict=True))


def run_pool_only(mix: list[tuple[str, str, bool]], workers: int, timeout: float) -> tuple[float, int]:
    """Every row through the pool (no in-process prejudging): what the pool itself adds over a plain loop."""
    from or1.rewards.math import verify_math
    from or1.rewards.score import close_pools, math_pool

    close_pools()  # fresh workers: the previous run's parse caches must not flatter this one
    pool = math_pool(workers)
    pool.start(wait=True)
    started = time.perf_counter()
    outcomes = pool.map(verify_math, [(r, gt) for r, gt, _ in mix], timeout=timeout)
    seconds = time.perf_counter() - started
    agree = sum(
        o.value is not None and o.value.correct == right
        for o, (_, _, right) in zip(outcomes, mix, strict=True)
    )
    return seconds, agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternate plain/or1 runs; the median ratio counts"
    )
    parser.add_argument("--pool-only", action="store_true", help="also time every row through the pool")
    args = parser.parse_args()
    mix = build_mix()
    if not mix:
        print(f"skipped: no benchmark files under {BENCHMARKS.resolve()}", file=sys.stderr)
        return 0
    import logging
    import statistics

    logging.getLogger("math_verify").setLevel(logging.ERROR)  # plain runs warn on every timeout
    from or1.rewards.math import prejudge
    from or1.rewards.score import close_pools

    n, right = len(mix), sum(r for *_, r in mix)
    decided = sum(prejudge(r, gt) is not None for r, gt, _ in mix)
    print(
        f"mix: {n} responses ({right} right, {n - right} wrong); {decided} decided in-process without sympy"
    )
    ratios = []
    for round_ in range(1, args.rounds + 1):
        close_pools()  # each round starts cold, like plain math-verify's fresh parse caches
        plain_s, plain_ok = run_plain(mix)
        ours_s, ours_ok = run_or1(mix, args.workers, args.timeout)
        ratios.append(plain_s / ours_s)
        print(
            f"round {round_}: math-verify plain {n / plain_s:6.1f}/s ({plain_ok}/{n} as labelled), "
            f"or1 score_batch {args.workers} workers {n / ours_s:6.1f}/s ({ours_ok}/{n} as labelled), "
            f"ratio {ratios[-1]:.2f}x"
        )
    if args.pool_only:
        pool_s, pool_ok = run_pool_only(mix, args.workers, args.timeout)
        print(f"or1 pool only (no in-process prejudging): {n / pool_s:6.1f}/s ({pool_ok}/{n} as labelled)")
    print(
        f"median ratio or1 / plain: {statistics.median(ratios):.2f}x, timeout {args.timeout:g} s enforced per verification"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
