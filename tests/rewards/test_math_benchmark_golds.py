"""Every AIME/MATH-500 gold of the benchmark folder (OR1_BENCHMARKS) is matched by itself in other spellings and
refuses a wrong one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.data.benchmarks import benchmark_folder
from or1.rewards.math import verify_math
from or1.rewards.normalize import parse_ground_truth

BENCHMARKS = benchmark_folder() or Path("OR1_BENCHMARKS is unset")


def _aime_golds() -> list[str]:
    golds = []
    for name in ("aime24/aime24.jsonl", "aime25/aime25.jsonl"):
        path = BENCHMARKS / name
        if not path.is_file():
            pytest.skip(f"{path} not present")
        for line in path.read_text().splitlines():
            golds += parse_ground_truth(json.loads(line)["reward_model"]["ground_truth"])
    return golds


def test_aime_golds_accept_plain_integers_and_refuse_neighbours() -> None:
    for gold in _aime_golds():
        value = int("".join(ch for ch in gold if ch.isdigit()))
        gt = json.dumps([gold])
        assert verify_math(f"\\boxed{{{value}}}", gt).correct, gold
        assert verify_math(f"The final answer is {value}.", gt).correct, gold
        assert not verify_math(f"\\boxed{{{value + 1}}}", gt).correct, gold


def test_math500_reference_solutions_are_judged_correct() -> None:
    path = BENCHMARKS / "math500" / "math500.jsonl"
    if not path.is_file():
        pytest.skip(f"{path} not present")
    rows = [json.loads(line) for line in path.read_text().splitlines()][::2]  # every other one keeps it quick
    misses = [r["answer"] for r in rows if not verify_math(r["solution"], json.dumps([r["answer"]])).correct]
    assert misses == []
    assert not any(verify_math("\\boxed{123457}", json.dumps([r["answer"]])).correct for r in rows)
