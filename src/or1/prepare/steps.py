"""The steps of `or1 prepare-data` after loading: each takes the rows still in and gives each a verdict (kept, or
dropped with a reason and a detail), which the pipeline (`or1.prepare.pipeline`) records in the ledger.

verifiable (filters) -> dedup -> decontaminate -> checks (reference solutions) -> difficulty. Train rows go
through every step; validation rows are evaluation data, kept whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from or1.data.records import read_records
from or1.errors import UserError
from or1.prepare import dedup, verifiable
from or1.prepare.adapters import Context, Malformed, adapt
from or1.prepare.difficulty import CACHE_FILE, GradeRun, Sampling, grade_rows
from or1.prepare.spec import DataSpec, SourceSpec

DUPLICATE, NEAR_DUPLICATE, CONTAMINATED = "duplicate", "near_duplicate", "contaminated"
TOO_EASY, TOO_HARD = "too_easy", "too_hard"


@dataclass
class Item:
    """A row on its way through the steps, with where it came from."""

    source: SourceSpec
    index: int
    row: dict[str, Any]


Verdict = tuple[str | None, str | None]  # (drop reason or None, detail)
Tick = Callable[[int], None]  # advances a step's progress bar by that many rows
Step = Callable[[DataSpec, list[Item], Tick], list[Verdict]]


def _graded(item: Item) -> bool:
    """Train rows go through every filter; validation rows are evaluation data, kept whole (avg@k is over all)."""
    return item.source.role == "train"


def filter_verifiable(spec: DataSpec, items: list[Item], tick: Tick) -> list[Verdict]:
    rules = set(spec.filters.rules)
    verdicts: list[Verdict] = []
    for item in items:
        found = verifiable.unverifiable(item.row) if _graded(item) else None
        tick(1)
        verdicts.append(found if found and found[0] in rules else (None, None))
    return verdicts


def drop_duplicates(spec: DataSpec, items: list[Item], tick: Tick) -> list[Verdict]:
    """Validation sources first, then train in spec order: the first occurrence of a problem is the one kept.
    Validation rows are never dropped; they only make train copies of themselves duplicates."""
    cfg = spec.dedup
    near = dedup.NearDuplicates(cfg.threshold, cfg.num_perm, cfg.shingle) if cfg.near else None
    seen: dict[str, str] = {}
    verdicts: list[Verdict] = [(None, None)] * len(items)
    order = sorted(range(len(items)), key=lambda i: items[i].source.role != "validation")
    for i in order:
        tick(1)
        item = items[i]
        text = verifiable.problem_text(item.row)
        where = f"{item.source.name}:{item.index}"
        key = f"{item.row['ability']}|{dedup.exact_key(text)}"
        if not _graded(item):
            seen.setdefault(key, where)
            if near is not None:
                near.add(where, text)
            continue
        if key in seen:
            verdicts[i] = (DUPLICATE, f"same as {seen[key]}")
            continue
        seen[key] = where
        earlier = near.add(where, text) if near is not None else None
        if earlier is not None:
            verdicts[i] = (NEAR_DUPLICATE, f"near {earlier}")
    return verdicts


def evaluation_problems(spec: DataSpec) -> list[tuple[str, str]]:
    """(name, problem text) of every evaluation problem the spec decontaminates against."""
    from or1.data.benchmarks import load_benchmark

    cfg = spec.decontaminate
    folder = Path(cfg.benchmark_dir) if cfg.benchmark_dir else None
    named = []
    for name in cfg.benchmarks:
        data = load_benchmark(
            name,
            folder=folder,
            window=None,
            other_fix="set decontaminate.benchmark_dir in the spec",
        )
        named += [(f"{name}:{i}", verifiable.problem_text(r)) for i, r in enumerate(data.rows)]
    for file in cfg.files:
        for i, record in enumerate(read_records(file, what="decontaminate.files:")):
            ability = "code" if "tests" in record or "question_content" in record else "math"
            try:
                row = adapt("auto", record, Context("eval", "test", i, ability))
            except Malformed as err:
                raise UserError(f"decontaminate.files: {file} record {i}: {err}") from None
            named.append((f"{Path(file).stem}:{i}", verifiable.problem_text(row)))
    return named


def decontaminate(spec: DataSpec, items: list[Item], tick: Tick) -> list[Verdict]:
    """Train rows that overlap an evaluation problem are dropped; validation rows are evaluation data themselves."""
    texts = [verifiable.problem_text(item.row) for item in items]
    train = [text for item, text in zip(items, texts, strict=True) if _graded(item)]
    # the training problems tell stock competition phrasing from what is distinctive in an evaluation problem
    index = dedup.ContaminationIndex(evaluation_problems(spec), n=spec.decontaminate.ngram, background=train)
    verdicts: list[Verdict] = []
    for item, text in zip(items, texts, strict=True):
        found = index.overlap(text) if _graded(item) else None
        tick(1)
        verdicts.append((CONTAMINATED, f"overlaps {found[0]}: {found[1]}") if found else (None, None))
    return verdicts


def check_references(spec: DataSpec, items: list[Item], tick: Tick, chunk: int = 256) -> list[Verdict]:
    """Reference checks in chunks (one progress update each): math answers, then code solutions."""
    verdicts: list[Verdict] = [(None, None)] * len(items)
    todo = [i for i, item in enumerate(items) if _graded(item)]  # validation rows are never checked
    for start in range(0, len(todo), chunk):
        part = todo[start : start + chunk]
        rows = [items[i].row for i in part]
        none: list[verifiable.Check] = [None] * len(rows)
        math = verifiable.check_math_answers(rows, spec.checks.workers) if spec.checks.math_answer else none
        code = (
            verifiable.check_code_solutions(rows, spec.checks.workers, spec.checks.sandbox)
            if spec.checks.code_solution
            else none
        )
        for i, m, c in zip(part, math, code, strict=True):
            verdicts[i] = m or c or (None, None)
        tick(len(rows))
    tick(len(items) - len(todo))
    return verdicts


def grade_difficulty(
    spec: DataSpec, items: list[Item], out: Path, ray_address: str | None, progress: Progress
) -> tuple[list[Verdict], dict[str, Any]]:
    from or1.hub import resolve_model

    cfg = spec.difficulty
    graded = [i for i, item in enumerate(items) if item.source.role == "train" and item.source.grade]
    task = progress.add_task("difficulty", total=len(graded))
    run = GradeRun(
        engine=cfg.engine,
        model_path=str(resolve_model(cfg.model)),
        model_name=cfg.name,
        executor=cfg.executor
        if cfg.executor != "auto"
        else ("ray" if ray_address or cfg.workers > 1 else "local"),
        workers=cfg.workers,
        chunk_size=cfg.chunk_size,
        cpus_per_worker=cfg.cpus_per_worker,
        gpus_per_worker=cfg.gpus_per_worker,
        reward_workers=cfg.reward_workers,
        micro_batch_size=cfg.micro_batch_size,
        ray_address=ray_address,
    )
    # the spec's max_new_tokens is the response budget
    sampling = Sampling(cfg.n, cfg.temperature, cfg.top_p, cfg.max_new_tokens, cfg.seed)
    counts, origins = grade_rows(
        [items[i].row for i in graded], sampling, run, out / CACHE_FILE, lambda k: progress.advance(task, k)
    )
    lo, hi = cfg.keep_range
    verdicts: list[Verdict] = [(None, None)] * len(items)
    for i, solved in zip(graded, counts, strict=True):
        extra = items[i].row.setdefault("extra_info", {})
        extra["model_difficulty"] = {**(extra.get("model_difficulty") or {}), cfg.name: solved}
        if solved < lo:
            verdicts[i] = (TOO_HARD, f"solved {solved}/{cfg.n}")
        elif solved > hi:
            verdicts[i] = (TOO_EASY, f"solved {solved}/{cfg.n}")
    histogram = Counter(counts)
    summary = {
        "model": cfg.name,
        "n": cfg.n,
        "keep": [lo, hi],
        "from": origins,
        "histogram": {str(k): histogram.get(k, 0) for k in range(cfg.n + 1)} if counts else {},
    }
    return verdicts, summary
