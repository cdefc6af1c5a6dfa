"""The tiny world's data: or1 rows of synthetic math and code tasks, deterministic from a seed, fully offline.

Validation sets are fixed (independent of the seed) and disjoint from every train set, so solve rates from
different runs compare. The generators themselves live in synthetic_math.py and synthetic_code.py, the way both
draw (a held-out set, endless draws that skip it) in synthetic_draws.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from or1.atomic import atomic_path
from or1.data.rows import write_rows
from or1.data.synthetic_code import code_row, code_tasks, validation_tasks
from or1.data.synthetic_math import (
    VALIDATION_OPS,
    ArithmeticProblem,
    distinct_problems,
    math_row,
    validation_problems,
)
from or1.errors import UserError
from or1.preflight import check_output_folder

SPLITS = ("train", "validation", "code_train", "code_validation")
RL_OPS = VALIDATION_OPS  # 2-operand problems are solved almost always after SFT: no RL signal


@dataclass(frozen=True)
class TinyDataset:
    """Where write_tiny_dataset put each split."""

    train: Path
    validation: Path
    code_train: Path
    code_validation: Path


def math_validation_rows() -> list[dict]:
    """The fixed math validation split as or1 rows (50 problems per operand count, 3..6 operands)."""
    return [math_row(p, i, "validation") for i, p in enumerate(validation_problems())]


def code_validation_rows() -> list[dict]:
    """The fixed code validation split as or1 rows (25 programs per step count, 3..6 steps)."""
    return [code_row(t, i, "validation") for i, t in enumerate(validation_tasks())]


def code_train_rows(seed: int, size: int) -> list[dict]:
    """`size` distinct code train rows (3..6 steps), none in the validation split."""
    return [code_row(t, i, "train") for i, t in enumerate(code_tasks(seed, size))]


def math_train_rows(seed: int, size: int, ops: Sequence[int] = RL_OPS) -> list[dict]:
    """`size` distinct math train rows, none in the validation split."""
    problems: list[ArithmeticProblem] = distinct_problems(seed, size, ops)
    return [math_row(p, i, "train") for i, p in enumerate(problems)]


def write_tiny_dataset(
    out_dir: str | Path,
    seed: int = 0,
    *,
    math_train_size: int = 1500,
    code_train_size: int = 1500,
    train_ops: Sequence[int] = RL_OPS,
    console: Console | None = None,
    overwrite: bool = False,
) -> TinyDataset:
    """Write the tiny world's four parquet files into `out_dir` and print what was written.

    train.parquet / validation.parquet hold math rows (validation: the fixed 200-problem held-out set with 3..6
    operands); code_train.parquet / code_validation.parquet hold stdin/stdout programs with real tests (validation:
    the fixed 100 programs of 3..6 steps). The same seed gives byte-identical rows. Raises UserError for sizes the
    generators cannot meet, and for files already in `out_dir` unless `overwrite`. Each file is written beside its
    name and renamed into place, so an interrupted run leaves complete files or none.
    """
    if min(math_train_size, code_train_size) < 1:
        raise UserError("Every tiny dataset size must be at least 1; fix the size option.")
    if not train_ops or min(train_ops) < 2 or max(train_ops) > 8:
        raise UserError(f"train_ops must be operand counts between 2 and 8, got {list(train_ops)}.")
    out = Path(out_dir)
    check_output_folder(out, "--out")
    existing = [str(out / f"{name}.parquet") for name in SPLITS if (out / f"{name}.parquet").exists()]
    if existing and not overwrite:
        raise UserError(
            f"{', '.join(existing)} already exist; pass --overwrite to replace them or choose another --out"
        )
    try:
        splits = {
            "train": math_train_rows(seed, math_train_size, train_ops),
            "validation": math_validation_rows(),
            "code_train": code_train_rows(seed, code_train_size),
            "code_validation": code_validation_rows(),
        }
    except ValueError as err:
        raise UserError(f"Cannot build the tiny dataset: {err}.") from None
    paths = {name: _write_atomically(out / f"{name}.parquet", rows) for name, rows in splits.items()}
    _print_summary(console or Console(), paths, splits)
    return TinyDataset(**paths)


def _write_atomically(path: Path, rows: list[dict]) -> Path:
    with atomic_path(path) as tmp:
        write_rows(tmp, rows)
    return path


def _print_summary(console: Console, paths: dict[str, Path], splits: dict[str, list[dict]]) -> None:
    table = Table(title="tiny dataset")
    for column in ("split", "rows", "file"):
        table.add_column(column)
    for name, rows in splits.items():
        table.add_row(name, str(len(rows)), str(paths[name]))
    console.print(table)
