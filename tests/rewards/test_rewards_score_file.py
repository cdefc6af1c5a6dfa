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


def ten_rows_with_a_lone_surrogate() -> str:
    """Ten jsonl rows; row 5's response holds a lone surrogate, as `"\\ud800"` in JSON (valid JSON, not UTF-8)."""
    lines = []
    for i in range(10):
        response = "\\\\boxed{3} \\ud800" if i == 4 else f"\\\\boxed{{{i}}}"
        lines.append(
            f'{{"ability": "math", "response": "{response}", "reward_model": {{"ground_truth": "[\\"3\\"]"}}, '
            f'"extra_info": {{"index": {i}}}}}\n'
        )
    return "".join(lines)


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_lone_surrogate_keeps_every_row(tmp_path: Path, suffix: str) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / f"out{suffix}"
    src.write_text(ten_rows_with_a_lone_surrogate())
    summary = score_file(src, out, workers=1, timeout=5.0)
    if suffix == ".jsonl":
        scored = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert scored[4]["response"] == "\\boxed{3} \ud800"  # written as an escape: it reads back exactly
    else:
        import pyarrow.parquet as pq

        scored = pq.read_table(out).to_pylist()
        assert scored[4]["response"] == "\\boxed{3} \\ud800"  # parquet strings are UTF-8: the escape as text
    assert [r["extra_info"]["index"] for r in scored] == list(range(10))
    assert [r["score"] for r in scored] == [1.0 if i in (3, 4) else 0.0 for i in range(10)]
    assert summary["rows"] == 10


def test_the_output_may_not_be_the_input(tmp_path: Path) -> None:
    src = tmp_path / "rows.jsonl"
    src.write_text(ten_rows_with_a_lone_surrogate())
    before = src.read_bytes()
    with pytest.raises(UserError, match="is the input file"):
        score_file(src, tmp_path / "." / "rows.jsonl", workers=1, timeout=5.0)
    assert src.read_bytes() == before


def test_an_empty_input_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    """0 rows scored to an empty output with exit 0 looked like success; the file is named instead."""
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(UserError, match=f"0 rows in {empty}"):
        score_file(empty, tmp_path / "out.jsonl", workers=1, timeout=5.0)
    assert not (tmp_path / "out.jsonl").exists()


def test_a_failed_write_leaves_the_old_output_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from or1.rewards import score_file as module

    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out.write_text("earlier results\n")
    written = []

    def fail_on_third(row: dict) -> str:
        if len(written) == 2:
            raise OSError("disk full")
        written.append(row)
        return json.dumps(row) + "\n"

    monkeypatch.setattr(module, "_json_line", fail_on_third)
    with pytest.raises(OSError, match="disk full"):
        score_file(src, out, workers=1, timeout=5.0)
    assert out.read_text() == "earlier results\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]  # no temporary file left


def test_lines_that_are_not_utf8_are_reported_and_scored(tmp_path: Path) -> None:
    src, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    good = [json.dumps(r).encode() + b"\n" for r in ROWS[:3]]
    bad = b'{"ability": "math", "response": "\\\\boxed{3} \xff", "reward_model": {"ground_truth": "[\\"3\\"]"}}\n'
    src.write_bytes(good[0] + good[1] + bad + good[2])
    summary = score_file(src, out, workers=1, timeout=5.0)
    assert len(summary["warnings"]) == 1
    assert "line 3 is not valid UTF-8 (byte 0xff" in summary["warnings"][0]
    scored = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [(r["score"], r["reason"]) for r in scored] == [
        EXPECTED[0],
        EXPECTED[1],
        (1.0, "correct"),
        EXPECTED[2],
    ]
    assert scored[2]["response"] == "\\boxed{3} \ufffd"
