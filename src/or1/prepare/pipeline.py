"""`or1 prepare-data --spec`: sources in, one step after another, train / validation parquet files out.

The steps, in order (each skipped when its spec section is disabled):
load (adapters) -> verifiable (filters) -> dedup -> decontaminate -> checks (reference solutions) -> difficulty.
Every row each step sees lands in the ledger, kept or dropped with a reason, so the report adds up and each dropped
row is traceable to its source position. The difficulty step is the only expensive one; it caches per problem in
the output folder, so rerunning after an interruption resumes it. Loading and the outputs are here, the steps after
loading in `or1.prepare.steps`.
"""

from __future__ import annotations

import json
import platform
import random
import re
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from or1.atomic import atomic_path, write_text_atomically
from or1.data.records import BadRecord
from or1.data.rows import write_rows
from or1.errors import UserError
from or1.prepare.adapters import Context, Malformed, adapt
from or1.prepare.ledger import Ledger, write_report
from or1.prepare.sources import iter_source, provenance
from or1.prepare.spec import DataSpec, SourceSpec, load_spec
from or1.prepare.steps import (
    Item,
    Step,
    Verdict,
    check_references,
    decontaminate,
    drop_duplicates,
    filter_verifiable,
    grade_difficulty,
)

MALFORMED, NOT_SELECTED = "malformed", "not_selected"


@dataclass(frozen=True)
class Prepared:
    """What a preparation wrote: the output files by name and the report."""

    files: dict[str, Path]
    report: dict[str, Any]


def prepare(
    spec_path: str | Path,
    out_dir: str | Path,
    *,
    ray_address: str | None = None,
    overwrite: bool = False,
    console: Console | None = None,
) -> Prepared:
    """Run the spec at `spec_path` into `out_dir` (see the module docstring); returns what was written.

    Finished output files in `out_dir` are a UserError unless `overwrite`; the difficulty cache is always reused.
    """
    path, spec, raw = load_spec(spec_path)
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder.")
    names = dict.fromkeys(s.output or s.role for s in spec.sources)
    existing = [str(out / f"{name}.parquet") for name in names if (out / f"{name}.parquet").exists()]
    if existing and not overwrite:
        raise UserError(
            f"{', '.join(existing)} already exist; pass --overwrite to replace them or choose another --out."
        )
    out.mkdir(parents=True, exist_ok=True)
    console = console or Console(stderr=True)
    ledger = Ledger(out)
    extra: dict[str, Any] = {}
    progress = Progress(
        TextColumn("{task.description:<14}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )
    try:
        with progress:
            items = _load(spec, ledger, progress)
            steps: list[tuple[str, bool, Step]] = [
                ("verifiable", spec.filters.enabled, filter_verifiable),
                ("dedup", spec.dedup.enabled, drop_duplicates),
                ("decontaminate", spec.decontaminate.enabled, decontaminate),
                ("checks", spec.checks.math_answer or spec.checks.code_solution, check_references),
            ]
            for name, enabled, step in steps:
                if enabled:
                    task = progress.add_task(name, total=len(items))
                    verdicts = step(spec, items, lambda k, task=task: progress.advance(task, k))
                    items = _apply(name, items, verdicts, ledger)
            if spec.difficulty.enabled:
                verdicts, extra["difficulty"] = grade_difficulty(spec, items, out, ray_address, progress)
                items = _apply("difficulty", items, verdicts, ledger)
    finally:
        ledger.close()
    files = _write_outputs(spec, items, out)
    extra["outputs"] = {name: count for name, (_, count) in files.items()}
    report = write_report(out, spec.name, ledger, extra)
    _write_manifest(out, path, spec, raw, report)
    for source, counts in report["sources"].items():  # malformed rows too: a user sees every loss here
        drops = ", ".join(f"{reason} {n}" for reason, n in counts["dropped"].items()) or "none"
        console.print(
            f"  {source}: {counts['in']} in, {counts['kept']} kept; dropped: {drops}", highlight=False
        )
    console.print(
        f"[green]prepared[/green] {spec.name}: "
        + ", ".join(f"{k} {v} rows" for k, v in extra["outputs"].items())
        + f" in {out} (report.md)"
    )
    return Prepared({name: p for name, (p, _) in files.items()}, report)


def _apply(name: str, items: list[Item], verdicts: list[Verdict], ledger: Ledger) -> list[Item]:
    """Record each row's verdict in the ledger; the rows kept."""
    kept = []
    for item, (reason, detail) in zip(items, verdicts, strict=True):
        ledger.record(name, item.source.name, item.index, reason, detail)
        if reason is None:
            kept.append(item)
    return kept


def _load(spec: DataSpec, ledger: Ledger, progress: Progress) -> list[Item]:
    task = progress.add_task("load", total=None)
    items = []
    for source in spec.sources:
        data_source = source.data_source or f"{source.role}-{source.name}"
        seen, before, why = 0, len(items), Counter[str]()  # why: each drop's reason, to name the commonest
        for index, record in iter_source(source):
            progress.advance(task)
            seen += 1
            if isinstance(record, BadRecord):
                ledger.record("load", source.name, index, MALFORMED, record.reason)
                why[_LINE.sub("", record.reason)] += 1
                continue
            if any(record.get(k) not in values for k, values in source.select.items()):
                ledger.record("load", source.name, index, NOT_SELECTED)
                why[f"not one of the values of `select` {source.select}"] += 1
                continue
            ctx = Context(data_source, source.role, index, source.ability)
            try:
                row = adapt(source.adapter, record, ctx)
            except Malformed as err:
                ledger.record("load", source.name, index, MALFORMED, str(err))
                why[str(err)] += 1
                continue
            ledger.record("load", source.name, index, None)
            items.append(Item(source, index, row))
        _check_loaded(source, seen, len(items) - before, why, ledger, progress.console)
    progress.update(task, total=progress.tasks[task].completed)
    return items


_LINE = re.compile(r"^line \d+: ")  # a reader's position prefix: the same problem on every line counts as one


def _check_loaded(
    source: SourceSpec, seen: int, kept: int, why: Counter[str], ledger: Ledger, console: Console
) -> None:
    """A source that gave no row is a mistake to report now, before the expensive steps: an empty input (unless
    the spec allows it), or records none of which could be used (the commonest reason named)."""
    if seen == 0:
        if source.allow_empty:
            console.print(f"[yellow]warning:[/yellow] source {source.name!r} holds no records (allow_empty)")
            return
        origin = source.path or (
            f"hub dataset {source.hub}" if source.hub else f"synthetic {source.synthetic}"
        )
        raise UserError(
            f"source {source.name!r}: {origin} holds no records; fix the source, or set allow_empty: true on it "
            "when it may be empty."
        )
    if kept == 0:
        reason, count = why.most_common(1)[0]
        raise UserError(
            f"source {source.name!r}: none of its {seen} records could be used; commonest ({count} of {seen}): "
            f"{reason} (every record's reason: {ledger.path})."
        )


def _write_outputs(spec: DataSpec, items: list[Item], out: Path) -> dict[str, tuple[Path, int]]:
    """One parquet file per output name (default: the role), rows shuffled by the spec seed unless told not to."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for source in spec.sources:  # every output named in the spec gets a file, even an empty one
        groups.setdefault(source.output or source.role, [])
    for item in items:
        groups[item.source.output or item.source.role].append(item.row)
    files = {}
    for name, rows in groups.items():
        if spec.shuffle:
            random.Random(f"{spec.seed}-{name}").shuffle(rows)
        files[name] = (_write(out / f"{name}.parquet", rows), len(rows))
    return files


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    """write_rows, atomically; when sources disagree on an extra_info field's type (TACO's "EASY" and Omni-MATH's
    6.5 as `difficulty`), such values are written as JSON text instead."""
    import pyarrow as pa

    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        try:
            write_rows(tmp, rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            keep = {"index", "model_difficulty"}
            for row in rows:
                extra = row.get("extra_info") or {}
                row["extra_info"] = {
                    k: v if k in keep or isinstance(v, str) else json.dumps(v, default=str)
                    for k, v in extra.items()
                }
            write_rows(tmp, rows)
    return path


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("or1", "datasets", "pyarrow", "datasketch", "torch", "transformers", "ray"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _write_manifest(
    out: Path, spec_path: Path, spec: DataSpec, raw: dict[str, Any], report: dict[str, Any]
) -> None:
    from or1.data.benchmarks import file_sha256

    manifest = {
        "spec": {"path": str(spec_path.resolve()), "sha256": file_sha256(spec_path), "content": raw},
        "inputs": [vars(provenance(s)) for s in spec.sources],
        "versions": _versions(),
        "counts": {"sources": report["sources"], "outputs": report.get("outputs", {})},
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    write_text_atomically(
        out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False, default=str) + "\n"
    )
