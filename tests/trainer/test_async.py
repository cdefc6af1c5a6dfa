"""Asynchronous RL on the separate placement (trainer/separate.Separate): the staleness bound under a slow trainer and
a slow rollout, the recipe checks, and, through `or1 train`, a resume and a rollout replica killed mid-generation, each
ending exactly where an uninterrupted asynchronous run ends, whose weights went to the replicas by the other route
(rollout.weight_transfer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from or1.config.recipe import resolve
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import POLICY_VERSION
from or1.hybrid.worker_group import WorkerError
from or1.layout import rollout_shard_file
from or1.preflight import check_device
from or1.trainer.separate import Separate as Pipelined
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import Sampled
from run_files import ENV, assert_same_weights, descendants, kill_while_writing, tiny_run, weights

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
ASYNC = [
    "rollout.placement=separate",
    "rollout.max_staleness=1",
    "algorithm.rollout_correction.is_level=token",
]


def config(k: int, steps: int):
    return resolve(
        "tiny",
        1,
        [
            "model.path=unused",
            "rollout.placement=separate",
            f"rollout.max_staleness={k}",
            "algorithm.rollout_correction.is_level=token",
            f"trainer.steps={steps}",
            "rollout.weight_transfer=object_store",  # FakeActor publishes a token through publish_weights
        ],
    )


class FakeActor:
    """The trainer's group: publish_weights hands out a token naming the version's weights."""

    def __init__(self) -> None:
        self.version = 0

    def publish_weights(self) -> list:
        return [(f"weights-{self.version}", None)]


class FakeReplicas:
    """Replicas that sample with the version last loaded, `delay` seconds a call; they may die on a chosen call."""

    def __init__(self, delay: float, die_on_call: int | None = None) -> None:
        self.delay, self.die_on_call, self.calls, self.version = delay, die_on_call, 0, 0
        self.loaded: list[tuple[int, str]] = []

    def load_weights(self, version: int, published: tuple) -> list[int]:
        assert published[0] == f"weights-{version}", "the replicas got another version's weights"
        self.loaded.append((version, published[0]))
        self.version = version
        return [version]

    def stream(self, method, on_rows, prompts, request) -> Batch:
        self.calls += 1
        on_rows(0, [{"key": 0}])
        time.sleep(self.delay)
        if self.calls == self.die_on_call:
            raise WorkerError("rollout", 0, method, "its actor process died", died=True)
        return Batch({POLICY_VERSION: torch.full((4,), self.version)})

    def shutdown(self) -> None:
        pass


class FakeSampler:
    """StepSampler's interface: one rollout call per step, its rows the sampled batch (a replaced replica's call
    is sampled again, as StepSampler.round does)."""

    def __init__(self, cfg) -> None:
        self.cfg, self.calls, self.started = cfg, [], 0

    def sample(self, step, stream, timer) -> Sampled:
        from or1.trainer.step_sampler import ReplicaReplaced

        self.started = step
        while True:
            try:
                batch = stream(lambda rank, rows: None, Batch.from_dict({"prompt_ids": [[1]] * 2}), None)
                break
            except ReplicaReplaced:
                continue
        self.calls.append(step)
        return Sampled(batch, batch, [], {"position": step}, timer)


def run_pipeline(k: int, steps: int, *, train_s: float, sample_s: float, die_on_call: int | None = None):
    """Train `steps` steps against fake replicas: each step's async/ metrics, and the pipeline."""
    actor, sampler = FakeActor(), FakeSampler(config(k, steps))
    first = FakeReplicas(sample_s, die_on_call)
    started = []

    def start_replicas():
        started.append(FakeReplicas(sample_s))
        return started[-1]

    pipeline = Pipelined(actor, sampler, first, start_replicas, max_restarts=1)
    pipeline.begin(0)
    seen = []
    try:
        for step in range(1, steps + 1):
            sampled = pipeline.take(step, PhaseTimer())
            # how far ahead the replicas have started sampling, as the update begins and as it ends
            seen.append({**sampled.metrics, "ahead_at_take": sampler.started - step})
            time.sleep(train_s)
            seen[-1]["ahead_after_update"] = sampler.started - step
            actor.version = step
            pipeline.trained(step)
    finally:
        pipeline.end()
    return seen, pipeline, sampler, started


@pytest.mark.parametrize("k", [0, 1, 2])
@pytest.mark.parametrize("slow", ["trainer", "rollout"])
def test_staleness_never_exceeds_k(k, slow):
    """Each step's batch is sampled with the weights after step s-1-k: staleness exactly min(k, s-1) whichever side is
    slow, and the replicas never sample more than k steps ahead of the trainer."""
    train_s, sample_s = (0.05, 0.0) if slow == "trainer" else (0.0, 0.05)
    seen, *_ = run_pipeline(k, 8, train_s=train_s, sample_s=sample_s)
    for step, m in enumerate(seen, start=1):
        assert m["async/staleness_max"] == m["async/staleness_mean"] == min(k, step - 1)
        assert m["ahead_at_take"] <= k and m["ahead_after_update"] <= k
        assert m["async/queue_depth"] <= k and m["async/groups_in_flight"] in (
            0,
            2,
        )  # a call: a step's 2 prompts
        if slow == "trainer" and step + k <= 8:
            assert (
                m["ahead_after_update"] == k
            )  # the replicas sampled ahead while the trainer trained, up to k


def test_replicas_swap_to_the_version_each_step_needs_and_old_versions_are_dropped():
    seen, pipeline, sampler, _ = run_pipeline(1, 6, train_s=0.01, sample_s=0.0)
    assert sampler.calls == list(range(1, 7))
    assert sorted(pipeline.versions) == [
        5,
        6,
    ]  # the newest and the k before it: nothing older is needed again


def test_a_replica_that_dies_mid_call_is_replaced_and_the_call_sampled_again():
    seen, pipeline, sampler, started = run_pipeline(1, 5, train_s=0.01, sample_s=0.0, die_on_call=3)
    assert len(started) == 1 and pipeline.restarts == 1
    assert sampler.calls == [1, 2, 3, 4, 5]  # every step sampled once: none lost, none twice
    for step, m in enumerate(seen, start=1):
        assert m["async/staleness_max"] == min(1, step - 1)
    # the new replica started on the model's weights (version 0) and loaded each version it needed
    assert started[0].loaded[0][0] == 1


def test_staleness_without_a_correction_is_refused():
    with pytest.raises(UserError, match="rollout_correction"):
        resolve("tiny", 1, ["model.path=unused", "rollout.placement=separate", "rollout.max_staleness=1"])
    forced = ["rollout.placement=separate", "rollout.max_staleness=1", "rollout.allow_uncorrected=true"]
    assert resolve("tiny", 1, ["model.path=unused", *forced]).rollout.max_staleness == 1
    with pytest.raises(UserError, match="placement separate"):
        resolve("tiny", 1, ["model.path=unused", "rollout.max_staleness=1", "rollout.allow_uncorrected=true"])


def test_the_nccl_weight_route_is_refused_off_gpus_in_one_line():
    separate = ["model.path=unused", "rollout.placement=separate", "rollout.weight_transfer_backend=nccl"]
    with pytest.raises(UserError, match="trainer.device cuda"):
        resolve("tiny", 1, separate)  # the tiny recipe trains on the CPU
    with pytest.raises(UserError, match="weight_transfer collective"):
        resolve("tiny", 1, [*separate, "trainer.device=cuda", "rollout.weight_transfer=object_store"])
    auto = resolve("tiny", 1, [*separate, "trainer.device=auto"])
    if not torch.cuda.is_available():
        with pytest.raises(UserError, match="weight_transfer_backend=gloo"):
            check_device(auto)


# ---- through or1 train -------------------------------------------------------------------------------------------
STEPS = 4


def command(run_dir: Path, model_dir: Path, data_dir: Path, resume: str) -> list[str]:
    overrides = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        *ASYNC,
        "trainer.devices_per_node=1",
        "rollout.replicas=2",
        f"trainer.steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=5",
        "trainer.samples_per_step=64",
        f"data.validation.sets=[{data_dir / 'validation.parquet'}]",
        "data.validation.max_problems=8",
        "data.validation.every=2",
    )
    sets = [x for o in overrides for x in ("--set", o)]
    cli = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--stage", "1"]
    return [*cli, "--run-dir", str(run_dir), "--resume", resume, *sets]


def run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def same_trajectory(run_dir: Path) -> list[dict]:
    """metrics.jsonl without what depends on timing (seconds, rates, how far the replicas ran ahead)."""
    lines = (run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()
    timing = ("time/", "perf/", "async/queue_depth", "async/groups_in_flight", "async/replica_restarts")
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(timing)} for line in lines]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, tiny_data_dir) -> Path:
    """The run the others must end like, its weights sent by the other route (rollout.weight_transfer
    object_store: gathered, through Ray's object store): the resumed and the killed runs send them by the default
    collective route, so each equality holds across both routes too."""
    run_dir = tmp_path_factory.mktemp("async") / "whole"
    run(
        [
            *command(run_dir, tiny_model_dir, tiny_data_dir, "never"),
            "--set",
            "rollout.weight_transfer=object_store",
        ]
    )
    return run_dir


def test_an_async_run_records_each_samples_policy_version(uninterrupted):
    records = same_trajectory(uninterrupted)
    assert [r["async/staleness_max"] for r in records if "async/staleness_max" in r] == [0, 1, 1, 1]
    for step in range(1, STEPS + 1):
        rows = [json.loads(x) for x in (uninterrupted / "stage1" / "samples" / f"step_{step}.jsonl").open()]
        assert {r["policy_version"] for r in rows} == {max(0, step - 2)}
    assert any(k.startswith("val/") for r in records for k in r)  # validation ran on the replicas


def test_each_rate_divides_by_the_devices_that_did_its_work(uninterrupted):
    """1 training rank and 2 replicas: generation per device over the 2 replicas, the update over the 1 rank, the
    whole step over all 3; summary.json and the step line name both kinds."""
    summary = json.loads((uninterrupted / "stage1" / "summary.json").read_text())
    facts = summary["device_peak"]
    assert (facts["devices"], facts["rollout_devices"], facts["step_devices"]) == (1, 2, 3)
    lines = (uninterrupted / "stage1" / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if "perf/generate_tokens_per_s" in r]
    assert len(steps) == STEPS
    for r in steps:
        assert r["perf/generate_tokens_per_s_per_device"] == pytest.approx(
            r["perf/generate_tokens_per_s"] / 2
        )
        assert 0 < r["perf/step_mfu"] < 1
    trained = [r for r in steps if not r.get("skipped")]  # a step with no group to learn from trains nothing
    assert trained
    for r in trained:
        assert r["perf/update_tokens_per_s_per_device"] == pytest.approx(r["perf/update_tokens_per_s"])
        assert r["perf/tokens_per_s_per_device"] == pytest.approx(r["perf/tokens_per_s"] / 3)


def test_resume_in_async_mode_with_a_replica_killed_ends_where_the_uninterrupted_run_ends(
    tmp_path, uninterrupted, tiny_model_dir, tiny_data_dir
):
    """Killed while writing step 3's checkpoint, resumed from step 2: the replicas sample step 3 again with the
    weights after step 1 (kept in the checkpoint). In the resumed run a replica is killed while it samples: it is
    replaced and sent the version it needs again, no group is lost or counted twice, and the run ends on the same
    metrics and weights."""
    run_dir = tmp_path / "resumed"
    kill_while_writing(
        command(run_dir, tiny_model_dir, tiny_data_dir, "never"), run_dir / "stage1" / "checkpoints", 3
    )
    # the weights after step 1, which step 3 samples with: the training rank's snapshot of its shard
    assert (run_dir / "stage1" / "checkpoints" / "step_2" / rollout_shard_file(1, 0, 1)).is_file()
    run_killing_a_sampling_replica(command(run_dir, tiny_model_dir, tiny_data_dir, "auto"), run_dir)
    last = json.loads((run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["async/replica_restarts"] == 1
    assert same_trajectory(run_dir) == same_trajectory(uninterrupted)
    assert_same_weights(weights(run_dir / "stage1" / "final"), weights(uninterrupted / "stage1" / "final"))


def rollout_stream_pid(root: int) -> int | None:
    """A rollout replica's process while it samples (Ray titles an actor's process with the method it runs)."""
    for pid in descendants(root):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RankActor.stream"):
                return pid
        except OSError:
            continue
    return None


def run_killing_a_sampling_replica(cmd: list[str], run_dir: Path) -> None:
    """Run `cmd` and SIGKILL a rollout replica while it samples, once step 1 is logged; the run must end well."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    killed = threading.Event()

    def kill_a_sampling_replica() -> None:
        deadline = time.monotonic() + 300
        metrics = run_dir / "stage1" / "metrics.jsonl"
        while time.monotonic() < deadline and proc.poll() is None:
            # after step 1 is logged, the next sampling call in progress dies
            if (
                metrics.is_file()
                and '"step": 1' in metrics.read_text()
                and (pid := rollout_stream_pid(proc.pid))
            ):
                os.kill(pid, signal.SIGKILL)
                killed.set()
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=kill_a_sampling_replica)
    watcher.start()
    _, err = proc.communicate(timeout=600)
    watcher.join()
    assert proc.returncode == 0, err[-3000:]
    assert killed.is_set(), "no replica was caught sampling"


def test_a_resume_without_the_older_versions_samples_the_newest_instead_of_waiting():
    """A checkpoint a colocated run wrote holds no older weight versions: resumed at step 3 with k = 1, step 4 samples
    with the weights after step 3 (staleness 0) instead of waiting for step 2's, which no one will publish."""
    actor, sampler = FakeActor(), FakeSampler(config(1, 6))
    pipeline = Pipelined(actor, sampler, FakeReplicas(0.0), lambda: FakeReplicas(0.0), max_restarts=0)
    actor.version = 3
    pipeline.begin(3)
    try:
        staleness = []
        for step in (4, 5, 6):
            staleness.append(pipeline.take(step, PhaseTimer()).metrics["async/staleness_max"])
            actor.version = step
            pipeline.trained(step)
    finally:
        pipeline.end()
    assert staleness == [0, 1, 1]
