"""`or1 eval` on engine replicas: the layout the devices allow, the same samples on 1 or 2 replicas, a replica
killed mid-evaluation replaced with every sample scored once."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path

import pytest

from or1.data.benchmarks import benchmark_folder
from or1.errors import UserError
from or1.eval import evaluate, replicas
from or1.eval.evaluate import run_eval
from or1.eval.replicas import Layout, plan_layout

BENCHMARKS = benchmark_folder()
needs_benchmarks = pytest.mark.skipif(
    BENCHMARKS is None or not BENCHMARKS.is_dir(),
    reason="no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)",
)


def test_the_layout_fills_the_devices() -> None:
    assert plan_layout(None, 1, gpus=8, cpus=64) == Layout(8, 1, 1, 0)
    assert plan_layout(None, 2, gpus=8, cpus=64) == Layout(4, 2, 2, 0)
    assert plan_layout(2, 2, gpus=8, cpus=64) == Layout(2, 2, 2, 0)
    # the CPU: replicas over the cores, each with its share of them as torch threads
    assert plan_layout(None, 1, gpus=0, cpus=2) == Layout(2, 1, 0, 1)
    assert plan_layout(1, 1, gpus=0, cpus=2) == Layout(1, 1, 0, 2)
    assert plan_layout(2, 1, gpus=0, cpus=16) == Layout(2, 1, 0, 8)
    with pytest.raises(UserError, match="need 16 GPUs; there are 8"):
        plan_layout(4, 4, gpus=8, cpus=64)
    with pytest.raises(UserError, match="at least 1"):
        plan_layout(0, 1, gpus=0, cpus=2)


def samples(out: Path) -> dict[tuple[str, int], dict]:
    """Each (problem, sample index) of samples.jsonl; fails when one appears twice."""
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()[1:]]
    keyed = {(r["problem_id"], r["sample_index"]): r for r in lines}
    assert len(keyed) == len(lines), "a sample was written twice"
    return keyed


def evaluate_tiny(model: Path, out: Path, **kwargs) -> Path:
    args = {
        "model": model,
        "n": 3,
        "data": BENCHMARKS / "aime24" / "aime24.parquet",
        "max_tokens": 24,
        "max_problems": 4,
        "out": out,
        "workers": 1,
        "batch_size": 4,
        "show_progress": False,
    }
    return run_eval("aime24", **{**args, **kwargs})


@pytest.fixture(scope="module")
def one_replica(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if BENCHMARKS is None or not BENCHMARKS.is_dir():
        pytest.skip("no benchmark folder")
    return samples(evaluate_tiny(tiny_model_dir, tmp_path_factory.mktemp("eval") / "one", replicas=1))


@needs_benchmarks
def test_two_replicas_write_the_samples_of_one(
    tiny_model_dir: Path, tmp_path: Path, one_replica: dict
) -> None:
    out = evaluate_tiny(tiny_model_dir, tmp_path / "two", replicas=2)
    assert samples(out) == one_replica and len(one_replica) == 12
    summary = json.loads((out / "summary.json").read_text())
    assert summary["layout"] == {
        "replicas": 2,
        "tensor_parallel_size": 1,
        "gpus_per_replica": 0,
        "threads_per_replica": summary["layout"]["threads_per_replica"],
        "replicas_replaced": 0,
    }
    assert summary["engine_build"]["name"] == "hf" and summary["engine_build"]["dtype"] == "float32"


@needs_benchmarks
def test_a_replica_killed_mid_evaluation_is_replaced_and_every_sample_is_scored_once(
    tiny_model_dir: Path, tmp_path: Path, one_replica: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    pools: list[replicas.ReplicaPool] = []
    real_init, real_record = replicas.ReplicaPool.__init__, evaluate._Job.record

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        pools.append(self)

    def record(self, positions, completions):  # after the first chunk: kill the actor, its work unfinished
        if not getattr(self, "killed", False):
            self.killed = True
            actors = [r for r in pools[0].replicas if r.handle is not None]
            assert len(actors) == 1  # the other replica samples in this process
            assert actors[0].outstanding > 0
            ray.kill(actors[0].handle, no_restart=True)
        real_record(self, positions, completions)

    monkeypatch.setattr(replicas.ReplicaPool, "__init__", init)
    monkeypatch.setattr(evaluate._Job, "record", record)
    out = evaluate_tiny(tiny_model_dir, tmp_path / "killed", replicas=2)
    assert samples(out) == one_replica  # each problem's samples once, and the same as one replica's
    summary = json.loads((out / "summary.json").read_text())
    assert summary["layout"]["replicas_replaced"] == 1
    assert summary["samples_generated"] == 12 and summary["metrics"]["num_problems"] == 4


def test_an_actor_that_cannot_start_is_a_one_line_error_not_a_death(tmp_path: Path) -> None:
    from or1.engines.rollout import EngineSettings
    from or1.eval.generation import engine_build
    from or1.eval.protocols import resolve_sampling
    from or1.hybrid.cluster import ray_session

    sampling = resolve_sampling("skywork", "math", seed=0, n=1, max_tokens=8)
    settings, layout = EngineSettings(seed=0), Layout(1, 1, 0, 1)
    with ray_session(None, num_cpus=1):
        pool = replicas.ReplicaPool(
            "hf", tmp_path / "missing", sampling, settings, layout, expected=engine_build("hf", settings)
        )
        try:
            with pytest.raises(UserError, match="an eval replica failed to start: .*missing") as error:
                pool.run([([{"role": "user", "content": "1+1?"}], 0)], lambda *_: None, batch=1)
        finally:
            pool.close()
    assert pool.restarts == 0 and "\n" not in str(error.value)


def test_a_slow_replica_gets_less_work_and_the_last_chunks_finish_together() -> None:
    """Dealing by outstanding work, simulated: replica 0 samples 5x slower (it drew long responses). It ends with
    about a sixth of the samples, and the evaluation ends within 10% of the ideal time, where an even split would
    take 3x as long."""
    pool = replicas.ReplicaPool.__new__(replicas.ReplicaPool)
    pool.replicas = [replicas._Replica(i, submit=lambda requests: object()) for i in range(2)]
    pool._done, pool._copied = set(), set()
    speed = {0: 1.0, 1: 5.0}  # samples per second
    queue, requests = deque(range(600)), [("prompt", 0)] * 600
    busy_until = {0: 0.0, 1: 0.0}
    finish: dict[object, float] = {}
    done = {0: 0, 1: 0}
    now = 0.0
    while len(pool._done) < 600:
        pool._deal(queue, requests, batch=32)
        for r in pool.replicas:  # a replica works through its chunks in order
            for ref, chunk in r.inflight.items():
                if ref not in finish:
                    busy_until[r.index] = max(busy_until[r.index], now) + len(chunk) / speed[r.index]
                    finish[ref] = busy_until[r.index]
        replica, ref = min(
            ((r, ref) for r in pool.replicas for ref in r.inflight), key=lambda x: finish[x[1]]
        )
        now = finish[ref]
        fresh = set(replica.inflight.pop(ref)) - pool._done
        pool._done |= fresh
        done[replica.index] += len(fresh)
    ideal = 600 / (speed[0] + speed[1])
    assert done[0] + done[1] == 600 and done[0] <= 600 / 6 + 10
    assert now <= 1.1 * ideal


@needs_benchmarks
def test_ctrl_c_on_replicas_keeps_what_was_scored_and_another_layout_resumes(
    tiny_model_dir: Path, tmp_path: Path, one_replica: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal

    from or1.stop import Interrupted

    real_record = evaluate._Job.record

    def record(self, positions, completions):  # Ctrl-C as the first chunk comes back
        if not getattr(self, "signalled", False):
            self.signalled = True
            os.kill(os.getpid(), signal.SIGINT)
        real_record(self, positions, completions)

    monkeypatch.setattr(evaluate._Job, "record", record)
    with pytest.raises(Interrupted, match="stopped after"):
        evaluate_tiny(tiny_model_dir, tmp_path / "stopped", replicas=2)
    kept = samples(tmp_path / "stopped")
    assert 0 < len(kept) < 12 and all(one_replica[k] == v for k, v in kept.items())
    monkeypatch.setattr(evaluate._Job, "record", real_record)
    out = evaluate_tiny(tiny_model_dir, tmp_path / "stopped", replicas=1)
    assert samples(out) == one_replica
    assert json.loads((out / "summary.json").read_text())["samples_reused"] == len(kept)


def test_ctrl_c_while_the_replicas_start_stops_with_nothing_in_flight() -> None:
    """SIGINT before the first chunk is dealt (the replicas still loading): the pool deals nothing and stops with
    Interrupted, which the CLI turns into exit 130 and the resume line (was a StopIteration traceback)."""
    import signal

    from or1.stop import Interrupted, StopFlag

    pool = replicas.ReplicaPool.__new__(replicas.ReplicaPool)
    pool.replicas = [
        replicas._Replica(i, submit=lambda requests: pytest.fail("a chunk was sent after the stop"))
        for i in range(2)
    ]
    stop = StopFlag()
    stop.signum = signal.SIGINT  # what the handler sets on the first Ctrl-C
    with pytest.raises(Interrupted, match="stopped after 0 of 3 samples") as stopped:
        pool.run([("prompt", 0)] * 3, lambda *_: pytest.fail("nothing was sampled"), batch=2, stop=stop)
    assert stopped.value.exit_code == 130
