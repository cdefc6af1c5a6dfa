"""Difficulty by sampling: how many of N samples of the target model solve each problem, as a resumable Ray job.

Each problem is sampled N times with or1's rollout engine and scored with or1's rewards (a truncated sample counts
as unsolved, as in training); the count goes to `extra_info.model_difficulty[<model name>]`. Problems that already
carry a count for that model are not sampled again. Finished problems are appended to a cache file in the output
folder chunk by chunk, so an interrupted run resumes where it stopped.

Grading runs in engine actors (`Grader`): with Ray, one actor per worker on whichever nodes the cluster offers
(`ray.util.ActorPool`, spread across nodes); without Ray (`executor: local`), one in this process.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1.data.records import prompt_key

CACHE_FILE = "difficulty_cache.jsonl"


@dataclass(frozen=True)
class Sampling:
    """How each problem is graded: n samples at temperature / top_p, at most max_response_length each."""

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_length: int = 1024
    seed: int = 0


class Grader:
    """Loads one rollout engine and counts, per problem, how many of n samples the rewards judge correct."""

    def __init__(
        self,
        engine: str,
        model_path: str,
        sampling: Sampling,
        reward_workers: int = 1,
        micro_batch_size: int = 128,
    ):
        self.sampling, self.reward_workers = sampling, reward_workers
        from or1.engines.loading import load_rollout_engine
        from or1.engines.rollout import EngineSettings
        from or1.tokens import load_tokenizer

        self.tokenizer = load_tokenizer(model_path)
        self.engine = load_rollout_engine(
            engine, model_path, EngineSettings(micro_batch_size=micro_batch_size)
        )

    def grade(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """{"solved": count per row, "node": where this ran}; the chunk's seed derives from its first prompt."""
        from or1.engines.rollout import SamplingParams
        from or1.rewards.score import score_batch
        from or1.tokens import prompt_ids

        s = self.sampling
        seed = (int(prompt_key(rows[0]), 16) + s.seed) % 2**31
        params = SamplingParams(
            n=s.n,
            temperature=s.temperature,
            top_p=s.top_p,
            max_response_length=s.max_response_length,
            seed=seed,
        )
        generations = self.engine.generate_ids(
            [prompt_ids(self.tokenizer, r["prompt"]) for r in rows], params
        )
        texts = self.tokenizer.batch_decode(generations.responses, skip_special_tokens=True)
        scored = score_batch(
            [{**rows[i // s.n], "response": text} for i, text in enumerate(texts)],
            workers=self.reward_workers,
        )
        solved = [0] * len(rows)
        for i, (result, cut) in enumerate(zip(scored, generations.truncated, strict=True)):
            solved[i // s.n] += int(result.correct and not cut)
        return {"solved": solved, "node": _node_id()}


def _node_id() -> str:
    try:
        import ray

        if ray.is_initialized():
            return ray.get_runtime_context().get_node_id()
    except ImportError:
        pass
    return "local"


def cache_settings(sampling: Sampling) -> dict[str, Any]:
    """What a cached count depends on besides the model and the prompt: a count of 16 samples is no count of 4."""
    return {
        "n": sampling.n,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "max_response_length": sampling.max_response_length,
    }


def read_cache(path: Path, model: str, sampling: Sampling | None = None) -> dict[str, int]:
    """Solved counts already in the cache for `model` (and, when given, these sampling settings), by prompt key
    (a torn last line from a kill is skipped; entries without settings predate them and are not reused)."""
    wanted = cache_settings(sampling) if sampling is not None else None
    counts: dict[str, int] = {}
    if not path.is_file():
        return counts
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or entry.get("model") != model:
            continue
        if wanted is None or entry.get("sampling") == wanted:
            counts[entry["key"]] = int(entry["solved"])
    return counts


def _append(path: Path, model: str, sampling: Sampling, keys: list[str], result: dict[str, Any]) -> None:
    settings = cache_settings(sampling)
    with path.open("a", encoding="utf-8") as handle:
        for key, solved in zip(keys, result["solved"], strict=True):
            entry = {
                "key": key,
                "model": model,
                "sampling": settings,
                "solved": solved,
                "node": result["node"],
            }
            handle.write(json.dumps(entry) + "\n")
        handle.flush()


@dataclass(frozen=True)
class GradeRun:
    """How a difficulty run is executed: where, with how many actors, in chunks of how many problems."""

    engine: str = "hf"
    model_path: str = ""
    model_name: str = ""
    executor: str = "ray"  # ray | local
    workers: int = 1
    chunk_size: int = 64
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    reward_workers: int = 1
    micro_batch_size: int = 128
    ray_address: str | None = None


def grade_rows(
    rows: list[dict[str, Any]],
    sampling: Sampling,
    run: GradeRun,
    cache: Path,
    advance: Callable[[int], None] = lambda n: None,
) -> tuple[list[int], dict[str, int]]:
    """Solved counts for `rows` (sampled, or from the cache or the rows' own model_difficulty) and where each
    count came from ({"stored", "cached", "sampled"} -> rows)."""
    counts: dict[str, int] = {}
    sources = {"stored": 0, "cached": 0, "sampled": 0}
    cached = read_cache(cache, run.model_name, sampling)
    todo: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = prompt_key(row)
        stored = ((row.get("extra_info") or {}).get("model_difficulty") or {}).get(run.model_name)
        if stored is not None:
            counts[key], sources["stored"] = int(stored), sources["stored"] + 1
        elif key in cached:
            counts[key], sources["cached"] = cached[key], sources["cached"] + 1
        else:
            todo.setdefault(key, row)
    advance(len(rows) - len(todo))
    if todo:
        keys = list(todo)
        chunks = [keys[i : i + run.chunk_size] for i in range(0, len(keys), run.chunk_size)]
        runner = _ray_chunks if run.executor == "ray" else _local_chunks
        for chunk, result in runner([[todo[k] for k in c] for c in chunks], chunks, sampling, run):
            _append(cache, run.model_name, sampling, chunk, result)
            counts.update(zip(chunk, result["solved"], strict=True))
            advance(len(chunk))
        sources["sampled"] = sum(1 for row in rows if prompt_key(row) in todo)
    return [counts[prompt_key(row)] for row in rows], sources


def _local_chunks(
    chunks: list[list[dict[str, Any]]], keys: list[list[str]], sampling: Sampling, run: GradeRun
) -> Iterator[tuple[list[str], dict[str, Any]]]:
    import torch

    # as many torch threads as a Ray actor would get: more OpenMP threads than cores spin and slow the tiny model
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(run.cpus_per_worker)))
    try:
        grader = Grader(run.engine, run.model_path, sampling, run.reward_workers, run.micro_batch_size)
        for chunk, chunk_keys in zip(chunks, keys, strict=True):
            yield chunk_keys, grader.grade(chunk)
    finally:
        torch.set_num_threads(threads)


def _ray_chunks(
    chunks: list[list[dict[str, Any]]], keys: list[list[str]], sampling: Sampling, run: GradeRun
) -> Iterator[tuple[list[str], dict[str, Any]]]:
    """Chunks graded by `run.workers` Grader actors spread over the cluster, yielded as each one finishes."""
    import ray

    from or1.hybrid.cluster import ray_session

    with ray_session(run.ray_address, log_to_driver=False):
        actor = ray.remote(num_cpus=run.cpus_per_worker, num_gpus=run.gpus_per_worker)(Grader)
        options = (run.engine, run.model_path, sampling, run.reward_workers, run.micro_batch_size)
        actors = [
            actor.options(scheduling_strategy="SPREAD").remote(*options)
            for _ in range(min(run.workers, len(chunks)))
        ]
        try:
            # each actor holds one chunk at a time, so a kill loses at most `workers` chunks of work
            queue, idle, pending = list(range(len(chunks))), list(actors), {}
            while queue or pending:
                while idle and queue:
                    worker, index = idle.pop(), queue.pop(0)
                    pending[worker.grade.remote(chunks[index])] = (index, worker)
                done, _ = ray.wait(list(pending), num_returns=1)
                index, worker = pending.pop(done[0])
                idle.append(worker)
                yield keys[index], ray.get(done[0])
        finally:
            for worker in actors:
                ray.kill(worker)
