"""prepare-data on real public rows (../shared/realdata, see its SOURCES.md): what a user loses on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.prepare import filters
from or1.prepare.adapters import Context, adapt

REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"


def real(relative: str) -> Path:
    path = REALDATA / relative
    if not path.exists():
        pytest.skip(f"{path} not found (the real-data samples live beside the checkout in shared/realdata)")
    return path


def jsonl(relative: str) -> list[dict]:
    return [json.loads(line) for line in real(relative).read_text().splitlines() if line.strip()]


def test_taco_picture_num_as_hub_string_zero_is_no_figure():
    rows = jsonl("taco/taco_picture_num_variants.jsonl")
    reasons = {
        repr(r["picture_num"]): filters.unverifiable_reason(adapt("taco", r, Context("taco", "train", i)))
        for i, r in enumerate(rows)
    }
    assert reasons == {"'0'": None, "None": None, "'1'": filters.URL_OR_FIGURE, "0": None}


def test_taco_card_row_is_kept_and_both_references_pass():
    from or1.rewards.code import score_code_batch
    from or1.sandbox.pool import close_pools, unavailable

    record = jsonl("taco/taco_card_example_1492B.jsonl")[0]
    row = adapt("taco", record, Context("taco", "train", 0))
    assert filters.unverifiable_reason(row) is None
    if unavailable("local"):
        pytest.skip(unavailable("local"))
    solutions = json.loads(record["solutions"])
    truth = row["reward_model"]["ground_truth"]
    try:
        results = score_code_batch([f"```python\n{s}\n```" for s in solutions], [truth] * len(solutions))
    finally:
        close_pools()
    assert [r.score for r in results] == [1.0] * len(solutions), results
