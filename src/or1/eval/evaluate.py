"""Run an evaluation: resolve benchmark and protocol, sample with a cache, score, and write the three outputs.

`run_eval` is what `or1 eval` calls. Generation is cached per (problem, sample index) in samples.jsonl and scored
as it goes, so a killed run restarts where it stopped; samples are drawn sample-index-major (every problem's first
sample, then every second one...) so even a partial run covers every problem. Ctrl-C (or SIGTERM) finishes and saves
the batch in progress, then stops with `Interrupted`; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import zlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from or1.data.benchmarks import load_benchmark
from or1.errors import UserError
from or1.eval.generation import DEFAULT_BATCH, Sampler, load_sampler
from or1.eval.grading import group_problems, score_completions
from or1.eval.metrics import compute_metrics
from or1.eval.protocols import PROTOCOLS, EvalSampling, resolve_sampling
from or1.eval.results import environment, model_fingerprint, now, write_outputs
from or1.eval.samples import SAMPLES_FILE, SampleCache
from or1.stop import StopFlag

Unit = tuple[dict[str, Any], str, int]  # (row, problem_id, sample_index)


def problem_id(index: int, row: dict[str, Any]) -> str:
    """A stable id: the position plus a short hash of prompt and ground truth, so a changed file never matches."""
    content = json.dumps([row["prompt"], row["reward_model"]["ground_truth"]], sort_keys=True)
    return f"{index:04d}-{hashlib.sha256(content.encode()).hexdigest()[:8]}"


def unit_seed(seed: int, unit: Unit) -> int:
    """The seed of a generate call, derived from the run seed and its first unit (stable across resumes)."""
    return zlib.crc32(f"{seed}:{unit[1]}:{unit[2]}".encode())


def default_out(model: Path, benchmark: str) -> Path:
    """The output folder named after the model, so two models never share one (or its sample cache).

    A model inside a run folder: runs/<name>/eval/<its path in the run, e.g. stage2-final>/<benchmark>/; any other:
    runs/eval/<folder name>-<8 hex digits of its absolute path's sha256>/<benchmark>/.
    """
    path = Path(str(model).rstrip("/"))
    for parent in path.parents:
        if parent.parent.name == "runs" and parent.name != "eval":
            return parent / "eval" / "-".join(path.relative_to(parent).parts) / Path(benchmark).stem
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]
    return Path("runs") / "eval" / f"{path.name or 'model'}-{digest}" / Path(benchmark).stem


def run_eval(
    benchmark: str,
    *,
    model: Path,
    n: int | None = None,
    protocol: str = "skywork",
    temperature: float | None = None,
    top_p: float | None = None,
    max_tokens: int | None = None,
    data: Path | None = None,
    engine: str = "hf",
    out: Path | None = None,
    seed: int = 0,
    max_problems: int | None = None,
    workers: int = 2,
    fresh: bool = False,
    batch_size: int | None = None,
    show_progress: bool = True,
) -> Path:
    """Evaluate `model` on `benchmark` and return the output folder holding samples.jsonl, summary.json, report.md.

    Settings come from `protocol`, each non-None flag overriding it. An existing samples.jsonl in the folder is
    resumed when it was made with the same model, data and sampling settings; otherwise this is a UserError,
    unless `fresh` discards it.
    """
    started = now()
    if engine not in DEFAULT_BATCH:
        raise UserError(f"Unknown engine {engine!r}; choose hf or vllm.")
    if max_problems is not None and max_problems < 1:
        raise UserError(f"--limit must be at least 1, got {max_problems}.")
    bench = load_benchmark(benchmark, data=data)
    rows = bench.rows[:max_problems] if max_problems else bench.rows
    sampling = resolve_sampling(
        protocol, bench.ability, seed=seed, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens
    )
    out = Path(out) if out is not None else default_out(model, bench.name)
    model_info = model_fingerprint(model)
    fingerprint = {
        "benchmark": bench.name,
        "data_sha256": bench.sha256 or bench.source,
        "model_sha256": model_info["sha256"] or model_info["path"],
        "engine": engine,
        **{k: v for k, v in sampling.to_dict().items() if k not in ("n", "overridden")},
    }
    cache = SampleCache(out / SAMPLES_FILE, fingerprint, fresh=fresh)
    ids = [problem_id(i, row) for i, row in enumerate(rows)]
    todo = [
        (row, pid, k)
        for k in range(sampling.n)
        for pid, row in zip(ids, rows, strict=True)
        if not cache.has(pid, k)
    ]
    reused = len(rows) * sampling.n - len(todo)
    if todo:
        stop = StopFlag("finishing and saving the current batch, then stopping")
        with stop.watching():
            sampler = load_sampler(engine, model, sampling)
            _generate(
                todo,
                sampler,
                cache,
                sampling,
                batch_size or DEFAULT_BATCH[engine],
                workers,
                show_progress,
                stop,
            )
    records = [cache.records[(pid, k)] for pid in ids for k in range(sampling.n)]
    metrics = compute_metrics(
        group_problems(ids, records, sampling.n), seed=seed, with_majority=bench.ability == "math"
    )
    summary = {
        "benchmark": bench.name,
        "engine": engine,
        "model": model_info,
        "data": {
            "source": bench.source,
            "sha256": bench.sha256,
            "num_problems": len(rows),
            "num_problems_in_source": len(bench.rows),
            "max_problems": max_problems,
            "date_filter": bench.date_filter,
        },
        "protocol": asdict(PROTOCOLS[protocol]),
        "sampling": sampling.to_dict(),
        "seed": seed,
        "samples_generated": len(todo),
        "samples_reused": reused,
        "environment": environment(),
        "started_at": started,
        "finished_at": now(),
        "command": _command(benchmark, model, sampling, data, engine, out, max_problems),
    }
    write_outputs(out, summary, metrics, records)
    return out


def _generate(
    todo: list[Unit],
    sampler: Sampler,
    cache: SampleCache,
    sampling: EvalSampling,
    batch: int,
    workers: int,
    show: bool,
    stop: StopFlag | None = None,
) -> None:
    """Sample, score and append `todo` in batches, with a progress bar and ETA; stop between batches on request."""
    columns = (
        TextColumn("sampling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not show, transient=False) as progress:
        task = progress.add_task("sampling", total=len(todo))
        for start in range(0, len(todo), batch):
            if stop is not None:
                stop.raise_if_requested(
                    f"stopped after {start} of {len(todo)} samples, all saved in {cache.path}"
                )
            units = todo[start : start + batch]
            completions = sampler([row["prompt"] for row, _, _ in units], unit_seed(sampling.seed, units[0]))
            cache.add(score_completions(units, completions, workers=workers))
            progress.advance(task, len(units))


def _command(
    benchmark: str, model: Path, s: EvalSampling, data: Path | None, engine: str, out: Path, limit: int | None
) -> str:
    """The `or1 eval` command line that reproduces this run (every sampling setting spelled out)."""
    args = [
        "or1",
        "eval",
        benchmark,
        "--model",
        str(model),
        "--protocol",
        s.protocol,
        "--n",
        str(s.n),
        "--temperature",
        str(s.temperature),
        "--top-p",
        str(s.top_p),
        "--max-tokens",
        str(s.max_tokens),
        "--seed",
        str(s.seed),
        "--engine",
        engine,
        "--out",
        str(out),
    ]
    if data is not None:
        args += ["--data", str(data)]
    if limit is not None:
        args += ["--limit", str(limit)]
    return shlex.join(args)
