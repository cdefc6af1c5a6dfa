"""The or1 row (data/README.md): build one, check one, and read or write a parquet file of them.

Every data source, the synthetic tiny world included, ends as rows of this shape, so training, filtering and
evaluation read one format.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from or1.errors import UserError

ABILITIES = ("math", "code")
ROLES = ("system", "user", "assistant")


def make_row(
    *,
    data_source: str,
    prompt: list[dict[str, str]],
    ability: str,
    ground_truth: Any,
    extra_info: dict[str, Any],
) -> dict[str, Any]:
    """Build one or1 row; `ground_truth` is JSON-encoded here unless it is already a string."""
    encoded = ground_truth if isinstance(ground_truth, str) else json.dumps(ground_truth)
    row = {
        "data_source": data_source,
        "prompt": [{"role": m["role"], "content": m["content"]} for m in prompt],
        "ability": ability,
        "reward_model": {"ground_truth": encoded, "style": "rule"},
        "extra_info": dict(extra_info),
    }
    validate_row(row)
    return row


def validate_row(row: dict[str, Any], where: str = "row") -> None:
    """Raise UserError naming the first field of `row` that breaks the or1 schema."""
    for key, kind in (("data_source", str), ("prompt", list), ("ability", str), ("reward_model", dict)):
        if not isinstance(row.get(key), kind):
            raise UserError(
                f"{where}: field '{key}' must be a {kind.__name__}, got {type(row.get(key)).__name__}."
            )
    if row["ability"] not in ABILITIES:
        raise UserError(f"{where}: field 'ability' must be one of {ABILITIES}, got {row['ability']!r}.")
    if not row["prompt"]:
        raise UserError(f"{where}: field 'prompt' is empty; it must hold at least one chat message.")
    for i, message in enumerate(row["prompt"]):
        if (
            not isinstance(message, dict)
            or message.get("role") not in ROLES
            or not isinstance(message.get("content"), str)
        ):
            raise UserError(f"{where}: prompt[{i}] must be {{role: one of {ROLES}, content: str}}.")
    truth = row["reward_model"].get("ground_truth")
    if not isinstance(truth, str):
        raise UserError(f"{where}: field 'reward_model.ground_truth' must be a JSON-encoded string.")
    if row["ability"] == "code":
        _validate_code_truth(truth, where)
    if row.get("extra_info") is not None and not isinstance(row["extra_info"], dict):
        raise UserError(f"{where}: field 'extra_info' must be a dict when present.")


def _validate_code_truth(truth: str, where: str) -> None:
    try:
        tests = json.loads(truth)
    except json.JSONDecodeError as err:
        raise UserError(f"{where}: code ground_truth is not valid JSON ({err.msg}).") from None
    if not isinstance(tests, dict):
        raise UserError(
            f"{where}: code ground_truth must be a JSON object (stdin/stdout, call-based or assert-based)."
        )
    # datasets.map pads heterogeneous dicts with None-valued keys: drop them before choosing the test form
    tests = {k: v for k, v in tests.items() if v is not None}
    if "test_code" in tests:
        return
    if not isinstance(tests.get("inputs"), list) or not isinstance(tests.get("outputs"), list):
        raise UserError(f"{where}: code ground_truth needs 'inputs' and 'outputs' lists, or 'test_code'.")
    if len(tests["inputs"]) != len(tests["outputs"]):
        raise UserError(
            f"{where}: code ground_truth has {len(tests['inputs'])} inputs but {len(tests['outputs'])} outputs."
        )


def write_rows(path: str | Path, rows: list[dict[str, Any]]) -> Path:
    """Write `rows` to one parquet file (parent folders are created) and return its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Read a parquet, jsonl or json file of or1 rows, checking each; a missing file or a bad row is a UserError."""
    from or1.data.records import read_records

    rows = read_records(path)
    for i, row in enumerate(rows):
        validate_row(row, where=f"{path} row {i}")
    return rows
