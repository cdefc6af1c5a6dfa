"""Wall time of one `or1 eval` on one engine replica against the same evaluation on two, in one run.

Usage: .venv/bin/python bench/bench_eval_replicas.py [--engine hf] [--problems 128] [--n 32] [--max-tokens 128]
       [--rounds 1]
Nothing downloaded: a random-init tiny-world-shaped Qwen2 (or1.tinyworld's default shape, a byte-level tokenizer
trained in seconds) and synthetic math problems of mixed prompt length, written to a temporary folder. Each round
runs `run_eval` three times on a fresh output folder, taking turns: `--replicas 1` (one engine in this process,
torch's default threads: every core; what `--replicas 1` gives a user), the same with torch held to one thread (a
reference: on a loaded machine several threads in one engine can be slower than one), and `--replicas 2` (two Ray
actors, the cores shared out: one thread each on 2 cores). The wall time is what a user waits: model loading,
Ray's start and the scoring included. All runs must write the same samples (each sample's seed is its own); the
script checks that, then prints one row per round, the median ratio two / one (the target on 2 cores: at most
0.6) and two / one-thread, and a JSON line. Each round then times the sampling alone, with no loading, Ray, dealing
or scoring in the clock: the same requests on one engine on every core, and split in two halves that two plain
processes sample at the same moment, one thread and one core each (the replica's own body, `EvalReplica`, without
Ray). Their ratio is the floor of two replicas on these cores: no dealing does better than two independent engines.
The default size (4,096 samples, avg@32's shape) keeps Ray's fixed cost (~8-10 s: its start, the actors' imports
and model loads, the shutdown) small beside the sampling.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def build_world(folder: Path, problems: int, spec: Any = None) -> tuple[Path, Path]:
    """A random-init model of `spec` (default: the tiny world's shape) and `problems` math rows (prompts of 1 to 8
    sentences)."""
    from or1.data.rows import make_row, write_rows
    from or1.tinyworld.architecture import TinyModelSpec, build_tiny_model
    from or1.tinyworld.tokenizer import train_tokenizer

    model = folder / "model"
    texts = [f"Find {a}+{b}. The answer is \\boxed{{{a + b}}}." for a in range(30) for b in range(9)]
    tokenizer = train_tokenizer(texts)
    spec = spec or TinyModelSpec(max_position_embeddings=1024)
    build_tiny_model(tokenizer, seed=0, spec=spec).save_pretrained(model)
    tokenizer.save_pretrained(model)
    rows = [
        make_row(
            data_source="bench",
            prompt=[{"role": "user", "content": " ".join(f"Find {i}+{j}." for j in range(1 + i % 8))}],
            ability="math",
            ground_truth=[str(i)],
            extra_info={"index": i},
        )
        for i in range(problems)
    ]
    return model, write_rows(folder / "problems.parquet", rows)


def timed_eval(
    model: Path, data: Path, out: Path, replicas: int, args: argparse.Namespace, threads: int | None = None
) -> tuple[float, dict]:
    """Seconds of one run_eval into `out` and its samples; `threads`: torch's threads in this process meanwhile."""
    import torch

    from or1.eval.evaluate import run_eval

    default_threads = torch.get_num_threads()
    torch.set_num_threads(threads or default_threads)
    start = time.perf_counter()
    run_eval(
        str(data),
        model=model,
        n=args.n,
        max_tokens=args.max_tokens,
        engine=args.engine,
        out=out,
        workers=1,
        show_progress=False,
        replicas=replicas,
    )
    seconds = time.perf_counter() - start
    torch.set_num_threads(default_threads)
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()[1:]]
    return seconds, {(r["problem_id"], r["sample_index"]): r["response"] for r in lines}


def sampling_alone(model: Path, data: Path, args: argparse.Namespace) -> tuple[float, float]:
    """Seconds of sampling alone: the evaluation's requests (run_eval's prompts and seeds) on one engine in this
    process on every core, and the slower of two processes sampling one half each at the same moment (one core and
    one thread each, as a replica has on 2 cores)."""
    from or1.data.benchmarks import load_benchmark
    from or1.engines.rollout import EngineSettings
    from or1.eval.evaluate import problem_id, problem_sample_seed
    from or1.eval.generation import DEFAULT_BATCH
    from or1.eval.protocols import resolve_sampling
    from or1.eval.replicas import EvalReplica

    bench = load_benchmark(str(data))
    sampling = resolve_sampling("skywork", bench.ability, seed=0, n=args.n, max_tokens=args.max_tokens)
    settings = EngineSettings(seed=sampling.seed)
    requests = [
        (row["prompt"], problem_sample_seed(sampling.seed, problem_id(i, row), k))
        for k in range(sampling.n)
        for i, row in enumerate(bench.rows)
    ]
    batch = DEFAULT_BATCH[args.engine]
    one = _time_sampling(EvalReplica(args.engine, str(model), sampling, settings, cores=[]), requests, batch)
    context = multiprocessing.get_context("spawn")
    barrier, seconds = context.Barrier(2), context.Queue()
    half = len(requests) // 2
    workers = [
        context.Process(
            target=_sample_half,
            args=(args.engine, str(model), sampling, settings, core, part, batch, barrier, seconds),
        )
        for core, part in enumerate((requests[:half], requests[half:]))
    ]
    for worker in workers:
        worker.start()
    times = [seconds.get() for _ in workers]
    for worker in workers:
        worker.join()
    return one, max(times)


def _sample_half(
    engine: str,
    model: str,
    sampling: Any,
    settings: Any,
    core: int,
    requests: list,
    batch: int,
    barrier: Any,
    out: Any,
) -> None:
    """One replica's body outside Ray on `core`: load, wait for the other half, then time the sampling."""
    from or1.eval.replicas import EvalReplica

    replica = EvalReplica(engine, model, sampling, settings, [core])
    barrier.wait()
    out.put(_time_sampling(replica, requests, batch))


def _time_sampling(replica: Any, requests: list, batch: int) -> float:
    """Seconds `replica` (an EvalReplica) takes to sample `requests` in chunks of `batch`."""
    start = time.perf_counter()
    for at in range(0, len(requests), batch):
        replica.generate(requests[at : at + batch])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engine", default="hf", choices=("hf", "vllm"))
    parser.add_argument("--problems", type=int, default=128)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="or1-bench-eval-") as tmp:
        model, data = build_world(Path(tmp), args.problems)
        for round_ in range(args.rounds):
            one, samples_one = timed_eval(model, data, Path(tmp) / f"one{round_}", 1, args)
            single, samples_single = timed_eval(
                model, data, Path(tmp) / f"single{round_}", 1, args, threads=1
            )
            two, samples_two = timed_eval(model, data, Path(tmp) / f"two{round_}", 2, args)
            if not samples_one == samples_single == samples_two:
                raise SystemExit("1 and 2 replicas wrote different samples")
            alone_one, alone_two = sampling_alone(model, data, args)
            load = os.getloadavg()[0]
            rows.append(
                {
                    "one_s": one,
                    "one_thread_s": single,
                    "two_s": two,
                    "sampling_one_s": alone_one,
                    "sampling_two_s": alone_two,
                    "load": load,
                    "ratio": two / one,
                    "ratio_one_thread": two / single,
                    "floor": alone_two / alone_one,
                }
            )
            print(
                f"round {round_ + 1}: 1 replica {one:.1f} s (on one thread {single:.1f} s), 2 replicas {two:.1f} s: "
                f"ratio {two / one:.2f} (to one thread {two / single:.2f}); sampling alone {alone_one:.1f} s on one "
                f"engine, {alone_two:.1f} s on two processes: floor {alone_two / alone_one:.2f}; load average "
                f"{load:.1f}",
                flush=True,
            )
    ratio, ratio_single, floor = (
        statistics.median(r[key] for r in rows) for key in ("ratio", "ratio_one_thread", "floor")
    )
    samples = args.problems * args.n
    verdict = "met" if ratio <= 0.6 else "NOT met"
    print(
        f"{args.engine}, {samples} samples x up to {args.max_tokens} tokens, {os.cpu_count()} cores: 2 replicas / "
        f"1 replica wall time = {ratio:.2f} (target <= 0.6: {verdict}); to 1 replica on one thread "
        f"{ratio_single:.2f}; floor on these cores {floor:.2f} (the sampling alone, two processes at once / one "
        "engine on every core)"
    )
    summary = {"engine": args.engine, "samples": samples, "max_tokens": args.max_tokens, "rounds": rows}
    medians = {"median_ratio": ratio, "median_ratio_one_thread": ratio_single, "median_floor": floor}
    print(json.dumps({**summary, **medians}))


if __name__ == "__main__":
    main()
