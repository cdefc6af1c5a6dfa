"""`or1 score` behind the CLI: jsonl and parquet in, the same rows with score and reason out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.errors import UserError
from or1.rewards.score_file import format_summary, score_file

ROWS = [
    {
        "data_source": "t",
        "ability": "math",
        "response": "\\boxed{025}",
        "reward_model": {"ground_truth": '["25"]', "style": "rule"},
        "extra_info": {"index": 0},
    },
    {
        "data_source": "t",
        "ability": "math",
        "response": "no idea",
        "reward_model": {"ground_truth": '["3"]', "style": "rule"},
        "extra_info": {"index": 1},
    },
    {
        "data_source": "t",
        "ability": "math",
        "response": "\\boxed{\\frac{1}{2}}",
        "reward_model": {"ground_truth": '["0.5"]', "style": "rule"},
        "extra_info": {"index": 2},
    },
    {
        "data_source": "t",
        "ability": "math",
        "reward_model": {"ground_truth": '["3"]', "style": "rule"},
        "extra_info": {"index": 3},
    },
]
EXPECTED = [(1.0, "correct"), (0.0, "no_answer"), (1.0, "correct"), (0.0, "bad_input")]


def test_jsonl_rows_come_back_with_score_and_reason(tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out" / "scored.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    summary = score_file(src, out, workers=2, timeout=5.0)
    scored = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["score"], r["reason"]) for r in scored] == EXPECTED
    assert [r["extra_info"]["index"] for r in scored] == [0, 1, 2, 3]  # other fields carried through
    assert summary["rows"] == 4 and summary["counts"] == {"correct": 2, "no_answer": 1, "bad_input": 1}
    assert summary["rows_per_second"] > 0
    assert "scored 4 rows" in format_summary(summary) and "correct 2" in format_summary(summary)


def test_parquet_rows_come_back_with_score_and_reason(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src, out = tmp_path / "in.parquet", tmp_path / "out.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), src)
    score_file(src, out, workers=1, timeout=5.0)
    scored = pq.read_table(out).to_pylist()
    assert [(r["score"], r["reason"]) for r in scored] == EXPECTED
    assert scored[0]["reward_model"]["style"] == "rule"


def test_missing_file_and_unknown_extension_are_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        score_file(tmp_path / "nope.jsonl", tmp_path / "o.jsonl", workers=1, timeout=1.0)
    (tmp_path / "rows.csv").write_text("a,b\n")
    with pytest.raises(UserError, match=".jsonl or .parquet"):
        score_file(tmp_path / "rows.csv", tmp_path / "o.jsonl", workers=1, timeout=1.0)
    (tmp_path / "bad.jsonl").write_text('{"ability": "math"}\n{oops\n')
    with pytest.raises(UserError, match="line 2"):
        score_file(tmp_path / "bad.jsonl", tmp_path / "o.jsonl", workers=1, timeout=1.0)
