"""Kill a training run with SIGKILL while it writes a checkpoint, resume with --resume auto, and end exactly where
an uninterrupted run of the same steps ends (weights and every non-timing metric)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from or1.trainer.checkpoint import CheckpointManager

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
STEPS = 4


def command(run_dir: Path, model_dir: Path, data_dir: Path, resume: str) -> list[str]:
    overrides = [
        f"model.path={model_dir}",
        f"data.train_files=[{data_dir / 'train.parquet'}]",
        f"trainer.steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=5",
        "trainer.batch_size=8",
        "actor.ppo_mini_batch_size=8",
        "rollout.n=4",
        "trainer.loggers=[jsonl]",
        f"data.validation.sets=[{data_dir / 'validation.parquet'}]",
        "data.validation.max_problems=8",
    ]
    code = (
        "import sys; from pathlib import Path; from or1.trainer.run import run_train; "
        "run_train(sys.argv[1], '1', Path(sys.argv[2]), sys.argv[4:], sys.argv[3], None)"
    )
    return [sys.executable, "-c", code, RECIPE, str(run_dir), resume, *overrides]


def run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]


def kill_while_writing(cmd: list[str], checkpoints: Path, step: int) -> None:
    """Start the run and SIGKILL its whole process group as soon as step_<step>.tmp appears."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    try:
        while not (checkpoints / f"step_{step}.tmp").exists():
            assert proc.poll() is None, "the run ended before the checkpoint write it should die in"
            assert time.monotonic() < deadline
            time.sleep(0.002)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))} for line in lines
    ]


@pytest.mark.slow
def test_killed_during_checkpoint_then_resumed_equals_uninterrupted(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    run(command(straight, tiny_model_dir, tiny_data_dir, "never"))

    kill_while_writing(
        command(killed, tiny_model_dir, tiny_data_dir, "never"), killed / "stage1" / "checkpoints", 3
    )
    manager = CheckpointManager(killed / "stage1", keep=5)
    assert manager.latest() == manager.root / "step_2"  # the half-written step 3 does not count
    assert (manager.root / "step_3.tmp").exists()
    run(command(killed, tiny_model_dir, tiny_data_dir, "auto"))

    assert metrics(killed) == metrics(straight)
    assert [m["step"] for m in metrics(killed)] == list(
        range(0, STEPS + 1)
    )  # step 0: validation before training
    a = load_file(straight / "stage1" / "final" / "model.safetensors")
    b = load_file(killed / "stage1" / "final" / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name
    assert not (manager.root / "step_3.tmp").exists()  # swept on resume
