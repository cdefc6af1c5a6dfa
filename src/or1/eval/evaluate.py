"""Run an evaluation: resolve benchmark and protocol, sample with a cache, score, and write the three outputs.

`run_eval` is what `or1 eval` calls. Generation is cached per (problem, sample index) in samples.jsonl and scored
as it goes, so a killed run restarts where it stopped; samples are drawn sample-index-major (every problem's first
sample, then every second one...) so even a partial run covers every problem. Each sample has its own seed, fixed by (run seed, problem, sample index),
so one engine in this process or several replicas on Ray (`or1.eval.replicas`) write the same samples. Ctrl-C (or
SIGTERM) finishes and saves the batches in progress, then stops with `Interrupted`; a second Ctrl-C exits at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import zlib
from collections.abc import Callable
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
from or1.engines.rollout import EngineSettings
from or1.errors import UserError
from or1.eval.generation import DEFAULT_BATCH, Completion, engine_build, load_sampler
from or1.eval.grading import group_problems, score_completions
from or1.eval.metrics import compute_metrics
from or1.eval.protocols import PROTOCOLS, EvalSampling, resolve_sampling
from or1.eval.replicas import Layout, ReplicaPool, plan_layout
from or1.eval.results import (
    check_not_smaller,
    discard_results,
    environment,
    model_fingerprint,
    now,
    write_outputs,
)
from or1.eval.samples import SAMPLES_FILE, SampleCache
from or1.stop import StopFlag

Unit = tuple[dict[str, Any], str, int]  # (row, problem_id, sample_index)
EVAL_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's share of each GPU: an eval engine has its GPUs to itself
SEEDING = "per sample: crc32('<seed>:<problem_id>:<sample_index>') & 0x7fffffff"  # recorded with the samples


def problem_id(index: int, row: dict[str, Any]) -> str:
    """A stable id: the position plus a short hash of prompt and ground truth, so a changed file never matches."""
    content = json.dumps([row["prompt"], row["reward_model"]["ground_truth"]], sort_keys=True)
    return f"{index:04d}-{hashlib.sha256(content.encode()).hexdigest()[:8]}"


def problem_sample_seed(seed: int, problem: str, index: int) -> int:
    """The seed of one sample: fixed by the run seed, the problem id and the sample index alone (SEEDING), so
    neither batching, resuming nor the replica layout changes it."""
    return zlib.crc32(f"{seed}:{problem}:{index}".encode()) & 0x7FFFFFFF


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
    overwrite: bool = False,
    batch_size: int | None = None,
    show_progress: bool = True,
    replicas: int | None = 1,
    tensor_parallel_size: int = 1,
    ray_address: str | None = None,
) -> Path:
    """Evaluate `model` on `benchmark` and return the output folder holding samples.jsonl, summary.json, report.md.

    Settings come from `protocol`, each non-None flag overriding it. An existing samples.jsonl in the folder is
    resumed when it was made with the same model, data, engine build and sampling settings; otherwise this is a
    UserError, and so is a complete evaluation there that this one would replace with fewer problems or samples,
    unless `overwrite` starts over (the cached samples discarded). `replicas` None: as many engines as the devices allow
    (`or1.eval.replicas.plan_layout`); one engine runs in this process, more on Ray (`or1.eval.replicas`).
    """
    started = now()
    if engine not in DEFAULT_BATCH:
        raise UserError(f"Unknown engine {engine!r}; choose hf or vllm.")
    if engine == "hf" and tensor_parallel_size != 1:
        raise UserError(
            "--tensor-parallel-size needs --engine vllm; the hf engine holds a model on one device."
        )
    if max_problems is not None and max_problems < 1:
        raise UserError(f"--limit must be at least 1, got {max_problems}.")
    if (replicas is not None and replicas < 1) or tensor_parallel_size < 1:  # before --out is written
        raise UserError(
            f"--replicas and --tensor-parallel-size must be at least 1, got {replicas} and {tensor_parallel_size}."
        )
    bench = load_benchmark(benchmark, data=data)
    rows = bench.rows[:max_problems] if max_problems else bench.rows
    sampling = resolve_sampling(
        protocol, bench.ability, seed=seed, n=n, temperature=temperature, top_p=top_p, max_tokens=max_tokens
    )
    settings = EngineSettings(
        seed=sampling.seed,
        tensor_parallel_size=tensor_parallel_size,
        gpu_memory_utilization=EVAL_GPU_MEMORY_UTILIZATION,
    )
    build = engine_build(engine, settings)
    out = Path(out) if out is not None else default_out(model, bench.name)
    model_info = model_fingerprint(model)
    fingerprint = {
        "benchmark": bench.name,
        "data_sha256": bench.sha256 or bench.source,
        "model_sha256": model_info["sha256"] or model_info["path"],
        "engine": engine,
        "engine_version": build.version,
        "dtype": build.dtype,
        "seeding": SEEDING,
        **{k: v for k, v in sampling.to_dict().items() if k not in ("n", "overridden")},
    }
    if overwrite:  # starting over: the old results describe samples about to be discarded
        discard_results(out)
    else:
        check_not_smaller(out, len(rows), sampling.n)
    cache = SampleCache(out / SAMPLES_FILE, fingerprint, fresh=overwrite)
    ids = [problem_id(i, row) for i, row in enumerate(rows)]
    todo = [
        (row, pid, k)
        for k in range(sampling.n)
        for pid, row in zip(ids, rows, strict=True)
        if not cache.has(pid, k)
    ]
    reused = len(rows) * sampling.n - len(todo)
    layout, restarts = None, 0
    if todo:
        stop = StopFlag("finishing and saving the batches in progress, then stopping")
        with stop.watching():
            job = _Job(
                todo, cache, sampling, batch_size or DEFAULT_BATCH[engine], workers, show_progress, stop
            )
            layout, restarts = _sample(job, engine, model, settings, replicas, ray_address)
    records = [cache.records[(pid, k)] for pid in ids for k in range(sampling.n)]
    metrics = compute_metrics(
        group_problems(ids, records, sampling.n), seed=seed, with_majority=bench.ability == "math"
    )
    summary = {
        "benchmark": bench.name,
        "engine": engine,
        "engine_build": asdict(build),
        "layout": {**layout.to_dict(), "replicas_replaced": restarts} if layout else None,
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
        "seeding": SEEDING,
        "samples_generated": len(todo),
        "samples_reused": reused,
        "environment": environment(),
        "started_at": started,
        "finished_at": now(),
        "command": _command(
            benchmark, model, sampling, data, engine, out, max_problems, tensor_parallel_size
        ),
    }
    write_outputs(out, summary, metrics, records)
    return out


class _Job:
    """The samples still to draw and where they go: scored, appended to the cache, counted on the progress bar."""

    def __init__(
        self,
        todo: list[Unit],
        cache: SampleCache,
        sampling: EvalSampling,
        batch: int,
        workers: int,
        show: bool,
        stop: StopFlag,
    ) -> None:
        self.todo, self.cache, self.sampling, self.batch = todo, cache, sampling, batch
        self.workers, self.show, self.stop = workers, show, stop
        self.requests = [(row["prompt"], problem_sample_seed(sampling.seed, pid, k)) for row, pid, k in todo]

    def record(self, positions: list[int], completions: list[Completion]) -> None:
        """Score the samples at `positions` of todo and append them to the cache."""
        units = [self.todo[p] for p in positions]
        self.cache.add(score_completions(units, completions, workers=self.workers))


def _sample(
    job: _Job, engine: str, model: Path, settings: EngineSettings, replicas: int | None, address: str | None
) -> tuple[Layout, int]:
    """Draw job's samples with the layout the devices allow; returns it and how many replicas were replaced."""
    import ray
    import torch

    if address is None:
        layout = plan_layout(
            replicas, settings.tensor_parallel_size, gpus=torch.cuda.device_count(), cpus=_cores()
        )
        if layout.replicas == 1:  # one engine: in this process, no Ray
            sampler = load_sampler(engine, model, job.sampling, settings)
            _with_progress(job, lambda on_done: _sample_here(job, sampler, on_done))
            return layout, 0
    from or1.hybrid.cluster import ray_session
    from or1.preflight import INSTALL_HINT, installed_build

    if engine == "vllm" and installed_build() is None:  # say so here, not in a replica's traceback
        raise UserError(f"rollout engine vllm needs vLLM, which is not installed: {INSTALL_HINT}")
    with ray_session(address, num_cpus=_cores() if address is None else None):
        resources = ray.cluster_resources()
        layout = plan_layout(
            replicas,
            settings.tensor_parallel_size,
            gpus=int(resources.get("GPU", 0)),
            cpus=int(resources["CPU"]),
        )
        # on this machine's cores one replica samples in this process (see or1.eval.replicas); tensor
        # parallelism pins a replica to its cores, which this process must not be
        here = address is None and not layout.gpus_per_replica and layout.tensor_parallel_size == 1
        pool = ReplicaPool(
            engine,
            model,
            job.sampling,
            settings,
            layout,
            expected=engine_build(engine, settings),
            local=here,
        )
        try:
            _with_progress(
                job, lambda on_done: pool.run(job.requests, on_done, batch=job.batch, stop=job.stop)
            )
        finally:
            pool.close()
        return layout, pool.restarts


def _sample_here(
    job: _Job, sampler: Callable, on_done: Callable[[list[int], list[Completion]], None]
) -> None:
    """One engine in this process: batch after batch, stopping between batches on request."""
    for start in range(0, len(job.requests), job.batch):
        job.stop.raise_if_requested(
            f"stopped after {start} of {len(job.requests)} samples, all saved in {job.cache.path}"
        )
        chunk = job.requests[start : start + job.batch]
        completions = sampler([prompt for prompt, _ in chunk], [seed for _, seed in chunk])
        on_done(list(range(start, start + len(chunk))), completions)


def _with_progress(job: _Job, body: Callable[[Callable[[list[int], list[Completion]], None]], None]) -> None:
    """Run `body(on_done)` under a progress bar with an ETA; on_done records a chunk and advances the bar."""
    columns = (
        TextColumn("sampling"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, disable=not job.show, transient=False) as progress:
        task = progress.add_task("sampling", total=len(job.todo))

        def on_done(positions: list[int], completions: list[Completion]) -> None:
            job.record(positions, completions)
            progress.advance(task, len(positions))

        body(on_done)


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _command(
    benchmark: str,
    model: Path,
    s: EvalSampling,
    data: Path | None,
    engine: str,
    out: Path,
    limit: int | None,
    tensor_parallel_size: int,
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
    if tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(tensor_parallel_size)]
    return shlex.join(args)
