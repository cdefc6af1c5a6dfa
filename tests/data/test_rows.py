import json

import pytest

from or1.data.rows import make_row, read_rows, validate_row, write_rows
from or1.errors import UserError


def _math_row(**changes):
    row = make_row(
        data_source="test-math",
        prompt=[{"role": "user", "content": "1+1?"}],
        ability="math",
        ground_truth=["2"],
        extra_info={"index": 0},
    )
    row.update(changes)
    return row


def test_make_row_encodes_ground_truth_as_json():
    row = _math_row()
    assert json.loads(row["reward_model"]["ground_truth"]) == ["2"]
    assert row["reward_model"]["style"] == "rule"


def test_plain_string_ground_truth_is_kept():
    row = make_row(
        data_source="s",
        prompt=[{"role": "user", "content": "q"}],
        ability="math",
        ground_truth="15625",
        extra_info={},
    )
    assert row["reward_model"]["ground_truth"] == "15625"


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"ability": "poetry"}, "ability"),
        ({"prompt": []}, "prompt"),
        ({"prompt": [{"role": "robot", "content": "x"}]}, "prompt[0]"),
        ({"data_source": 3}, "data_source"),
        ({"reward_model": {"ground_truth": ["2"], "style": "rule"}}, "ground_truth"),
    ],
)
def test_bad_rows_name_the_field(changes, field):
    with pytest.raises(UserError, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_row(_math_row(**changes))


def test_code_ground_truth_forms():
    def code(truth):
        return _math_row(ability="code", reward_model={"ground_truth": json.dumps(truth), "style": "rule"})

    validate_row(code({"inputs": ["1\n"], "outputs": ["1\n"]}))
    validate_row(code({"inputs": ["1"], "outputs": ["1"], "fn_name": "f"}))
    validate_row(
        code({"import_prefix": "", "test_code": "def check(c): pass", "entry_point": "f", "inputs": None})
    )
    with pytest.raises(UserError, match="2 inputs but 1 outputs"):
        validate_row(code({"inputs": ["1", "2"], "outputs": ["1"]}))
    with pytest.raises(UserError, match="not valid JSON"):
        validate_row(_math_row(ability="code", reward_model={"ground_truth": "{oops", "style": "rule"}))


def test_parquet_round_trip(tmp_path):
    rows = [_math_row(), _math_row()]
    path = write_rows(tmp_path / "sub" / "rows.parquet", rows)
    assert read_rows(path) == rows


def test_missing_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_rows(tmp_path / "nope.parquet")
