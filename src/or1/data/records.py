"""The one reader of record files in or1: parquet, jsonl or json (also gzipped: .jsonl.gz, .json.gz, as
LeetCodeDataset ships), from any schema, with each record's position.

Training, evaluation and `or1 prepare-data` all read files through here. `iter_records` is forgiving: a line that
is not JSON or not an object comes back as a `BadRecord` at its position, so a data pipeline can count and trace
it instead of crashing. `read_records` is strict: the first bad record is a one-line UserError.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1.errors import UserError

SUFFIXES = (".parquet", ".jsonl", ".json", ".jsonl.gz", ".json.gz")


@dataclass(frozen=True)
class BadRecord:
    """A record that could not be read: why, at which 0-based position of the file."""

    index: int
    reason: str


def file_kind(path: Path) -> str | None:
    """The kind of a record file by its name (one of SUFFIXES, longest first), or None."""
    name = path.name.lower()
    return next((s for s in sorted(SUFFIXES, key=len, reverse=True) if name.endswith(s)), None)


def check_file(path: str | Path, what: str = "Data file") -> Path:
    """`path` as a Path when it is an existing file of a readable kind; otherwise a UserError naming the fix."""
    path = Path(path)
    if file_kind(path) is None:
        raise UserError(
            f"{what} {path} must end in .parquet, .jsonl, .json, .jsonl.gz or .json.gz (got '{path.suffix}')."
        )
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist; write it first (or1 prepare-data) or fix the path.")
    return path


def iter_records(
    path: str | Path, what: str = "Data file"
) -> Iterator[tuple[int, dict[str, Any] | BadRecord]]:
    """(position, record) for every record of the file; unreadable records come back as BadRecord.

    A .json file holds a list of records, or an object with a single list value. A file that cannot be opened or
    parsed at all is a UserError.
    """
    path = check_file(path, what)
    kind = file_kind(path)
    try:
        if kind == ".parquet":
            import pyarrow.parquet as pq

            for index, record in enumerate(pq.read_table(path).to_pylist()):
                yield index, record
            return
        if kind in (".jsonl", ".jsonl.gz"):
            with _open_text(path) as handle:
                index = 0
                for number, line in enumerate(handle, start=1):
                    if line.strip():
                        yield index, _parse_line(line, index, number)
                        index += 1
            return
        with _open_text(path) as handle:
            records = _json_list(json.loads(handle.read()), path)
    except UserError:
        raise
    except (ValueError, OSError, EOFError) as err:  # gzip: BadGzipFile is an OSError, a cut file EOFError
        raise UserError(f"Cannot read {path}: {type(err).__name__}: {err}".splitlines()[0]) from None
    except Exception as err:  # pyarrow raises several types for a corrupt file
        raise UserError(f"Cannot read {path} as parquet ({type(err).__name__}).") from None
    for index, record in enumerate(records):
        yield index, record if isinstance(record, dict) else BadRecord(index, "not a JSON object")


def read_records(path: str | Path, what: str = "Data file") -> list[dict[str, Any]]:
    """Every record of the file; the first unreadable one is a UserError naming its position."""
    records = []
    for index, record in iter_records(path, what):
        if isinstance(record, BadRecord):
            raise UserError(f"{path} record {index}: {record.reason}; fix or remove it.")
        records.append(record)
    return records


def _open_text(path: Path) -> Any:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(encoding="utf-8")


def _parse_line(line: str, index: int, number: int) -> dict[str, Any] | BadRecord:
    try:
        record = json.loads(line)
    except ValueError as err:
        return BadRecord(index, f"line {number}: not valid JSON ({err.msg} at column {err.colno})")
    return record if isinstance(record, dict) else BadRecord(index, f"line {number}: not a JSON object")


def _json_list(loaded: Any, path: Path) -> list[Any]:
    if isinstance(loaded, dict) and len(loaded) == 1 and isinstance(next(iter(loaded.values())), list):
        loaded = next(iter(loaded.values()))
    if not isinstance(loaded, list):
        raise UserError(f"{path} must hold a JSON list of records (or an object with one list).")
    return loaded


def prompt_key(row: dict[str, Any]) -> str:
    """A stable id of a prompt (its messages), shared by training's per-prompt solve counts across stages and by
    data preparation's difficulty counts."""
    text = json.dumps(list(row["prompt"]), sort_keys=True, ensure_ascii=False)
    return hashlib.sha1(text.encode()).hexdigest()[:16]
