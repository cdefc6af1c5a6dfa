"""The benchmark registry: where each benchmark's data lives and how it becomes or1 rows.

A benchmark resolves, in order: `--data PATH` (a parquet / jsonl / json file in any schema data/converters.py
reads), else its file in the benchmark folder named by the OR1_BENCHMARKS environment variable (the registry's
`file` below, e.g. $OR1_BENCHMARKS/aime24/aime24.parquet) when it is there, else the hub id through
`datasets.load_dataset` (the default: no folder is needed online). A path given as the benchmark name itself is
evaluated as a file of or1 rows.

LiveCodeBench takes a contest-date window (default 2024-08-01 .. 2025-02-01, the paper's). The window only applies
when the source has dates: the hub rows carry `contest_date`, but the local public-test file has none (it is that
window already), so for it the filter is skipped and the summary says so.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from or1.data.converters import record_date, to_or1_row
from or1.data.records import read_records
from or1.errors import UserError
from or1.manifest import sha256 as file_sha256  # one file hash for benchmark files, data specs and exports

BENCHMARKS_ENV = "OR1_BENCHMARKS"  # a folder of local benchmark files, laid out as the registry's `file`s
LCB_WINDOW = (date(2024, 8, 1), date(2025, 2, 1))
_LCB_FILES = [
    f"hf://datasets/livecodebench/code_generation_lite/test{s}.jsonl" for s in ("", "2", "3", "4", "5", "6")
]


@dataclass(frozen=True)
class Benchmark:
    """One registry entry: its ability, its file in the benchmark folder, and the hub source used without one."""

    name: str
    ability: str
    file: str  # relative to the benchmark folder (OR1_BENCHMARKS)
    hub_id: str  # what the summary names as the source
    # datasets.load_dataset arguments; several are concatenated in order
    hub_loads: tuple[dict[str, Any], ...]
    dated: bool = False  # whether a contest-date window applies


def _hub(path: str, split: str, name: str | None = None) -> dict[str, Any]:
    return {"path": path, "split": split, **({"name": name} if name else {})}


REGISTRY: dict[str, Benchmark] = {
    b.name: b
    for b in (
        Benchmark(
            "aime24",
            "math",
            "aime24/aime24.parquet",
            "HuggingFaceH4/aime_2024",
            (_hub("HuggingFaceH4/aime_2024", "train"),),
        ),
        Benchmark(
            "aime25",
            "math",
            "aime25/aime25.parquet",
            "opencompass/AIME2025",  # part I (0-14), then II (15-29)
            (
                _hub("opencompass/AIME2025", "test", "AIME2025-I"),
                _hub("opencompass/AIME2025", "test", "AIME2025-II"),
            ),
        ),
        Benchmark(
            "math500",
            "math",
            "math500/math500.jsonl",
            "HuggingFaceH4/MATH-500",
            (_hub("HuggingFaceH4/MATH-500", "test"),),
        ),
        Benchmark(
            "amc",
            "math",
            "amc/amc_2022_2023.json",
            "AI-MO/aimo-validation-amc",
            (_hub("AI-MO/aimo-validation-amc", "train"),),
        ),
        Benchmark(
            "livecodebench",
            "code",
            "livecodebench/lcb_2408_2502_public.json",
            "livecodebench/code_generation_lite",
            # the raw jsonl: datasets 4+ runs no scripts
            ({"path": "json", "data_files": _LCB_FILES, "split": "train"},),
            dated=True,
        ),
    )
}


@dataclass
class BenchmarkData:
    """A resolved benchmark: its rows, where they came from, their content hash, and how dates were filtered."""

    name: str
    ability: str
    rows: list[dict[str, Any]]
    source: str  # a file path or a hub id
    sha256: str | None  # of the source file's bytes; None for hub data (the id and revision stand in)
    date_filter: str  # what the window did, in words, for the summary


def benchmark_folder() -> Path | None:
    """The folder of local benchmark files that OR1_BENCHMARKS names; None when it is unset (the hub ids serve)."""
    value = os.environ.get(BENCHMARKS_ENV, "").strip()
    return Path(value).expanduser() if value else None


def load_benchmark(
    benchmark: str,
    *,
    data: Path | None = None,
    window: tuple[date, date] | None = LCB_WINDOW,
    folder: Path | None = None,
    other_fix: str = "pass --data PATH",
) -> BenchmarkData:
    """Resolve `benchmark` (a registry name, or a path to an or1-row file) into or1 rows.

    `folder` None: the OR1_BENCHMARKS folder, if set. `other_fix` is the caller's own way to name a file, which the
    error for a benchmark found nowhere offers besides OR1_BENCHMARKS."""
    spec = REGISTRY.get(benchmark)
    if spec is None:
        path = Path(benchmark)
        if path.suffix in (".parquet", ".jsonl", ".json") and data is None:
            return _from_file(path.stem, _ability_of_file(path), path, None)
        raise UserError(
            f"Unknown benchmark {benchmark!r}; choose one of {', '.join(REGISTRY)} or give an or1-row file."
        )
    folder = folder if folder is not None else benchmark_folder()
    if data is None and folder is not None and (folder / spec.file).is_file():
        data = folder / spec.file
    if data is not None:
        return _from_file(spec.name, spec.ability, Path(data), window if spec.dated else None)
    return _from_hub(spec, window if spec.dated else None, folder, other_fix)


def _convert(name: str, ability: str, records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    source = f"test-{ability}-{name}"
    rows = []
    for i, record in enumerate(records):
        try:
            rows.append(to_or1_row(record, ability=ability, data_source=source, index=i))
        except UserError as err:
            raise UserError(f"{where}: {err}") from None
    if not rows:
        raise UserError(f"0 rows in {where}; an evaluation needs at least one problem.")
    return rows


def _windowed(
    records: list[dict[str, Any]], window: tuple[date, date] | None
) -> tuple[list[dict[str, Any]], str]:
    if window is None:
        return records, "none"
    dates = [record_date(r) for r in records]
    if all(d is None for d in dates):
        return records, f"not applied: the source has no contest dates (window {window[0]}..{window[1]})"
    kept = [r for r, d in zip(records, dates, strict=True) if d is not None and window[0] <= d <= window[1]]
    return kept, f"contest_date in {window[0]}..{window[1]}: kept {len(kept)} of {len(records)}"


def _from_file(name: str, ability: str, path: Path, window: tuple[date, date] | None) -> BenchmarkData:
    records, note = _windowed(read_records(path, what="Benchmark file"), window)
    rows = _convert(name, ability, records, str(path))
    return BenchmarkData(name, ability, rows, str(path.resolve()), file_sha256(path), note)


def _from_hub(
    spec: Benchmark, window: tuple[date, date] | None, folder: Path | None, other_fix: str
) -> BenchmarkData:
    import datasets  # only here: loading the hub is the slow, online path

    records: list[dict[str, Any]] = []
    for kwargs in spec.hub_loads:
        try:
            records += [dict(r) for r in datasets.load_dataset(**kwargs)]
        except Exception as err:  # offline machines and missing ids alike: point at local files instead
            looked = (
                f"{folder / spec.file} does not exist" if folder is not None else f"{BENCHMARKS_ENV} is unset"
            )
            raise UserError(
                f"Cannot load {spec.name}: no local file ({looked}) and the hub's {spec.hub_id} cannot be loaded "
                f"({err.__class__.__name__}); set {BENCHMARKS_ENV} to a folder holding {spec.file}, or {other_fix}."
            ) from None
    records, note = _windowed(records, window)
    rows = _convert(spec.name, spec.ability, records, spec.hub_id)
    return BenchmarkData(spec.name, spec.ability, rows, f"hub:{spec.hub_id}", None, note)


OR1_COLUMNS = ("data_source", "prompt", "ability", "reward_model")
PREPARE_HINT = "or1 prepare-data turns it into rows (a spec naming the file as a source)"


def _ability_of_file(path: Path) -> str:
    """An or1-row file names its ability per row; the first row's decides which scorer defaults apply. A file with
    no rows, of another schema, or of rows missing a column is a UserError saying which."""
    records = read_records(path, what="Benchmark file")
    if not records:
        raise UserError(f"0 rows in {path}; an evaluation needs at least one problem.")
    for index, record in enumerate(records):
        missing = [column for column in OR1_COLUMNS if column not in record]
        if len(missing) == len(OR1_COLUMNS):
            raise UserError(
                f"{path} is not a file of or1 rows (record {index} has keys {sorted(record)}); {PREPARE_HINT}, "
                "or give a registry benchmark name."
            )
        if missing:
            raise UserError(
                f"{path} record {index} has no {' or '.join(map(repr, missing))} column, which every or1 row has "
                f"({', '.join(OR1_COLUMNS)}); {PREPARE_HINT}."
            )
    ability = records[0]["ability"]
    if ability not in ("math", "code"):
        raise UserError(f"{path} record 0: field 'ability' must be math or code, got {ability!r}.")
    return ability
