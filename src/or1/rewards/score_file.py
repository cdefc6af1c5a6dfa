"""`or1 score INPUT --out OUTPUT`: score a jsonl or parquet file of or1 rows that carry a `response` field.

Every input row comes out again with `score` and `reason` added (all other fields carried through), in the
format the output's extension names. A malformed row scores 0 with reason bad_input; only a missing or unreadable
file is a user error. A line that is not valid UTF-8 is read with the bad bytes replaced (U+FFFD) and reported by
line number; text that UTF-8 cannot hold (a lone surrogate such as "\\ud800" in JSON) is written escaped. The output
is written to a temporary file and renamed into place, so it never holds half the rows, and it may not be the input.
`format_summary` is the line the CLI prints to stderr afterwards.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from or1.atomic import atomic_path
from or1.errors import UserError
from or1.preflight import check_output_file
from or1.rewards.result import Result
from or1.rewards.score import score_batch

FORMATS = {".jsonl": "jsonl", ".parquet": "parquet"}
# rows per score_batch call: small enough for a lively progress bar, large enough to fill the pool
CHUNK_ROWS = 256


def _format_of(path: Path, role: str) -> str:
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise UserError(
            f"{role} {path} must end in .jsonl or .parquet (got '{path.suffix or 'no extension'}')."
        )
    return fmt


def read_score_input(path: Path, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """The rows of a jsonl or parquet file, as dicts. Raises UserError for a missing or unreadable file.

    Lines of a jsonl file that are not valid UTF-8 are decoded with replacement characters; each is reported in
    `warnings` by line number.
    """
    fmt = _format_of(path, "INPUT")
    if not path.is_file():
        raise UserError(f"INPUT {path} does not exist; pass the path of a .jsonl or .parquet file.")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path).to_pylist()
        except Exception as err:  # pyarrow raises several types for a corrupt file
            raise UserError(f"INPUT {path} is not a readable parquet file ({type(err).__name__}).") from err
    rows = []
    with path.open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                line = raw.decode("utf-8", errors="replace")
                if warnings is not None:
                    warnings.append(
                        f"INPUT {path} line {number} is not valid UTF-8 (byte 0x{raw[err.start]:02x} at column "
                        f"{err.start + 1}); read with the bad bytes replaced by U+FFFD"
                    )
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                raise UserError(
                    f"INPUT {path} line {number} is not valid JSON; fix or remove that line."
                ) from err
            # a non-object line is scored as bad_input, kept visible
            rows.append(row if isinstance(row, dict) else {"_value": row})
    return rows


def _encodable(value: Any) -> Any:
    """`value` with every string UTF-8 can hold; a lone surrogate is written as its escape, \\ud800."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value.encode("utf-8", errors="backslashreplace").decode("utf-8")
        return value
    if isinstance(value, dict):
        return {_encodable(k): _encodable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_encodable(v) for v in value]
    return value


def _json_line(row: dict[str, Any]) -> str:
    """One JSON line; a row holding a lone surrogate is written with ASCII escapes, which keep it exactly."""
    line = json.dumps(row, ensure_ascii=False)
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        line = json.dumps(row, ensure_ascii=True)
    return line + "\n"


def _column(pa: Any, values: list[Any]) -> Any:
    """An Arrow column; one whose values have mixed types (a malformed row's int `response`) becomes JSON text."""
    values = [_encodable(v) for v in values]
    try:
        return pa.array(values)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return pa.array(
            [v if v is None or isinstance(v, str) else json.dumps(v, ensure_ascii=False) for v in values]
        )


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    """Write rows in the format of `path`'s extension, creating its folder if needed.

    The rows go to a temporary file beside `path`, renamed over it only once complete.
    """
    fmt = _format_of(path, "OUTPUT")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        if fmt == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            # every row's keys, first-seen order
            keys = list(dict.fromkeys(key for row in rows for key in row))
            columns = {key: _column(pa, [row.get(key) for row in rows]) for key in keys}
            pq.write_table(pa.table(columns), tmp)
        else:
            with tmp.open("w", encoding="utf-8") as handle:
                for row in rows:
                    handle.write(_json_line(row))


def _score_with_progress(
    rows: list[dict[str, Any]], workers: int, timeout: float, code_timeout: float | None
) -> list[Result]:
    """score_batch over chunks of rows, with a rich progress bar on stderr."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    results: list[Result] = []
    columns = (TextColumn("scoring"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("scoring", total=len(rows))
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[start : start + CHUNK_ROWS]
            results.extend(score_batch(chunk, workers=workers, timeout=timeout, code_timeout=code_timeout))
            progress.advance(task, len(chunk))
    return results


def score_file(
    input_path: Path, output_path: Path, *, workers: int, timeout: float, code_timeout: float | None = None
) -> dict[str, Any]:
    """Score every row of `input_path`, write them with `score` and `reason` to `output_path`, return a summary.

    `timeout` bounds each math verification; `code_timeout` each code test (None: the code reward's 6 s).

    Summary keys: rows, counts (rows per reason), mean_score, seconds, rows_per_second, warnings.
    """
    if workers < 1:
        raise UserError(f"--workers must be at least 1 (got {workers}).")
    if timeout <= 0:
        raise UserError(f"--math-timeout must be a positive number of seconds (got {timeout}).")
    input_path, output_path = Path(input_path), Path(output_path)
    _format_of(output_path, "--out")
    check_output_file(output_path, "--out")
    if output_path.resolve() == input_path.resolve():
        raise UserError(
            f"--out {output_path} is the input file; write the scored rows to another path, so the input "
            "stays intact if scoring stops"
        )
    warnings: list[str] = []
    rows = read_score_input(input_path, warnings)
    if not rows:
        raise UserError(f"0 rows in {input_path}; nothing to score.")
    started = time.perf_counter()
    results = _score_with_progress(rows, workers, timeout, code_timeout)
    seconds = time.perf_counter() - started
    for row, result in zip(rows, results, strict=True):
        row["score"] = result.score
        row["reason"] = result.reason
    write_rows(output_path, rows)
    counts = Counter(result.reason for result in results)
    return {
        "rows": len(rows),
        "counts": dict(counts.most_common()),
        "mean_score": sum(r.score for r in results) / len(results) if results else 0.0,
        "seconds": round(seconds, 3),
        "rows_per_second": round(len(rows) / seconds, 1) if seconds > 0 else 0.0,
        "warnings": warnings,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """One line for stderr: rows, throughput, mean score and the count of each reason."""
    counts = ", ".join(f"{reason} {count}" for reason, count in summary["counts"].items()) or "no rows"
    return (
        f"scored {summary['rows']} rows in {summary['seconds']:.1f} s ({summary['rows_per_second']:.1f} rows/s), "
        f"mean score {summary['mean_score']:.3f}: {counts}"
    )
