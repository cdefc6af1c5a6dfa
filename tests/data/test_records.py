"""The record reader: gzipped files as LeetCodeDataset ships them, and bad lines named by their line number."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from or1.data.records import BadRecord, iter_records, read_records
from or1.errors import UserError

LEETCODE_GZ = (
    Path(__file__).resolve().parents[3]
    / "shared"
    / "realdata"
    / "leetcode"
    / "LeetCodeDataset-v0.3.1-test.jsonl.gz"
)


def test_gzipped_jsonl_and_json_are_read_directly(tmp_path: Path):
    records = [{"problem": "1+1?", "answer": "2"}, {"problem": "2+2?", "answer": "4"}]
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    with gzip.open(tmp_path / "rows.json.gz", "wt", encoding="utf-8") as handle:
        json.dump(records, handle)
    assert read_records(tmp_path / "rows.jsonl.gz") == records
    assert read_records(tmp_path / "rows.json.gz") == records
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(b'{"a": 1}\n' * 100)[:-12])
    with pytest.raises(UserError, match="Cannot read"):
        read_records(tmp_path / "cut.jsonl.gz")


def test_the_real_leetcode_file_is_read_gzipped():
    if not LEETCODE_GZ.exists():
        pytest.skip(
            f"{LEETCODE_GZ} not found (the real-data samples live beside the checkout in shared/realdata)"
        )
    records = read_records(LEETCODE_GZ)
    assert len(records) == 228 and {"task_id", "problem_description", "test", "entry_point"} <= set(
        records[0]
    )


def test_a_bad_line_keeps_its_line_number(tmp_path: Path):
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n\n{not json\n[1]\n')
    got = list(iter_records(tmp_path / "rows.jsonl"))
    assert got[1] == (
        1,
        BadRecord(
            1, "line 3: not valid JSON (Expecting property name enclosed in double quotes at column 2)"
        ),
    )
    assert got[2][1].reason == "line 4: not a JSON object"
    with pytest.raises(UserError, match="line 3"):
        read_records(tmp_path / "rows.jsonl")
