"""The code judge on the probes of ../shared/realdata/mangled/sandbox_probes.jsonl: programs that real datasets'
reference solutions and LeetCode's judge rely on (@dataclass in every test form; sortedcontainers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.rewards.code import score_code_batch
from or1.sandbox.runner import SANDBOX_PACKAGES

PROBES = Path(__file__).resolve().parents[3] / "shared" / "realdata" / "mangled" / "sandbox_probes.jsonl"


@pytest.fixture(scope="module")
def probes() -> dict[str, dict]:
    if not PROBES.exists():
        pytest.skip(f"{PROBES} not found (the real-data samples live beside the checkout in shared/realdata)")
    rows = [json.loads(line) for line in PROBES.read_text().splitlines() if line.strip()]
    return {row["data_source"].removeprefix("probe-"): row for row in rows}


def score(backend: str, row: dict):
    return score_code_batch([row["response"]], [row["reward_model"]["ground_truth"]], backend=backend)[0]


@pytest.mark.parametrize("form", ["dataclass-stdin", "dataclass-call", "dataclass-assert"])
def test_a_dataclass_works_in_every_test_form(backend: str, probes: dict[str, dict], form: str):
    result = score(backend, probes[form])
    assert result.score == 1.0, result


def test_sortedcontainers_is_there_as_on_leetcode(backend: str, probes: dict[str, dict]):
    linked = Path(SANDBOX_PACKAGES) / "sortedcontainers"
    if backend == "local" and not linked.exists():
        pytest.skip(f"{linked} is missing: scripts/setup.sh (as root) installs it for the local sandbox")
    result = score(backend, probes["sortedcontainers-stdin"])
    assert result.score == 1.0, result
