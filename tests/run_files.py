"""The short tiny runs of the trainer and scoring tests, what they compare between two runs (metrics without
timings, and saved weights), and the two-node local Ray cluster of the multi-node tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors.torch import load_file

ENV = {**os.environ, "COLUMNS": "1000"}  # rich wraps console lines at 80 columns off a terminal


@contextmanager
def two_node_cluster(head_cpus: float, worker_cpus: float) -> Iterator[tuple]:
    """A head and a worker node on this machine (ray.cluster_utils.Cluster, each with its own CPUs): (cluster,
    worker node); shut down on exit."""
    from ray.cluster_utils import Cluster  # only the multi-node tests pay for it

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": head_cpus, "include_dashboard": False}
    )
    worker_node = cluster.add_node(num_cpus=worker_cpus)
    cluster.wait_for_nodes()
    try:
        yield cluster, worker_node
    finally:
        cluster.shutdown()


def tiny_run(model: Path, train_file: Path, *settings: str) -> list[str]:
    """--set overrides of a short run of the tiny recipe: 8 prompts x 4 samples a step, one optimizer step per batch,
    metrics in jsonl only; `settings` come after (and so override) these."""
    return [
        f"model.path={model}",
        f"data.train_files=[{train_file}]",
        "trainer.batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "rollout.n=4",
        "trainer.loggers=[jsonl]",
        *settings,
    ]


def metrics(run_dir: Path, stage: str = "1") -> list[dict]:
    """stage<N>/metrics.jsonl without its timings."""
    lines = (run_dir / f"stage{stage}" / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))} for line in lines
    ]


def weights(model_dir: Path) -> dict:
    return load_file(model_dir / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name


def wait_for_checkpoint(proc: subprocess.Popen, run_dir: Path, step: int, timeout: float) -> None:
    """Poll until the running `or1 train` of `run_dir` has committed stage 1's checkpoint of `step`."""
    from or1.trainer.checkpoint import LATEST_FILE

    latest, deadline = run_dir / "stage1" / "checkpoints" / LATEST_FILE, time.monotonic() + timeout
    while not (latest.is_file() and latest.read_text().strip() == f"step_{step}"):
        assert proc.poll() is None, f"the run ended before step {step}'s checkpoint"
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within {timeout:.0f} s"
        time.sleep(0.02)


def kill_while_writing(cmd: list[str], checkpoints: Path, step: int) -> None:
    """Start the run and SIGKILL its whole process group as soon as step_<step>.tmp appears."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=ENV
    )
    deadline = time.monotonic() + 600
    try:
        while not (checkpoints / f"step_{step}.tmp").exists():
            assert proc.poll() is None, "the run ended before the checkpoint write it should die in"
            assert time.monotonic() < deadline
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def descendants(root: int) -> list[int]:
    """Every process below `root` (Ray's raylet and workers are children of the driver's local cluster)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found
