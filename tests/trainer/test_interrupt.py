"""Ctrl-C and SIGTERM through a real `or1 train` process: it stops between steps with a checkpoint, says how to
resume, exits 130 / 143, and the rerun it names ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from or1.scoring import SLOWEST_ROWS
from run_files import assert_same_weights, metrics, tiny_run, weights

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
STEPS = 4
ENV = {**os.environ, "COLUMNS": "1000"}  # rich wraps console lines at 80 columns off a terminal
OR1 = [sys.executable, "-m", "or1.cli"]


def train_args(run_dir: Path, model_dir: Path, data_dir: Path) -> list[str]:
    sets = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        f"trainer.steps={STEPS}",
        "trainer.save_every=4",  # only the last step is due: a stop mid-stage must write its own checkpoint
        "trainer.keep_checkpoints=5",
        f"data.validation.sets=[{data_dir / 'validation.parquet'}]",
        "data.validation.max_problems=8",
    )
    return ["train", "--recipe", RECIPE, "--run-dir", str(run_dir), *[a for s in sets for a in ("--set", s)]]


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "stage1" / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.endswith("}")]


def interrupt(args: list[str], run_dir: Path, signum: int, when: str, times: int = 1) -> tuple[int, str]:
    """Start `or1 train` in its own process group, send `signum` to the whole group (as a terminal's Ctrl-C does)
    once `when` holds ("start": the stage folder exists; "step": step 1 is logged), `times` times; exit code and
    stderr."""
    proc = subprocess.Popen(
        [*OR1, *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=ENV,
    )
    deadline = time.monotonic() + 600
    ready = {
        "start": lambda: (run_dir / "stage1" / "config.yaml").is_file(),
        "step": lambda: 1 in logged_steps(run_dir),
    }[when]
    while not ready():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.01)
    for _ in range(times):
        os.killpg(proc.pid, signum)
        time.sleep(0.2)
    _, err = proc.communicate(timeout=600)
    return proc.returncode, err


def resume_line(stderr: str) -> list[str]:
    """The rerun command the stop message names, as arguments after `or1`."""
    found = re.findall(r"to resume, run: (or1 .*)$", stderr, flags=re.MULTILINE)
    assert len(found) == 1, stderr[-3000:]
    return shlex.split(found[0])[1:]


def run_to_end(args: list[str]) -> None:
    done = subprocess.run([*OR1, *args], capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path, tiny_data_dir: Path) -> Path:
    """One uninterrupted run of the stage, the reference every interrupted run must end equal to."""
    run_dir = tmp_path_factory.mktemp("straight")
    run_to_end(train_args(run_dir, tiny_model_dir, tiny_data_dir))
    return run_dir


@pytest.mark.slow  # three tiny `or1 train` runs (and the session's tiny model)
def test_ctrl_c_mid_stage_checkpoints_exits_130_and_the_rerun_ends_like_an_uninterrupted_run(
    tmp_path: Path, straight: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    args = train_args(run_dir, tiny_model_dir, tiny_data_dir)
    code, err = interrupt(args, run_dir, signal.SIGINT, "step")

    assert code == 130, err[-3000:]
    assert "Traceback" not in err
    stopped = logged_steps(run_dir)[-1]
    assert 1 <= stopped < STEPS  # it stopped between steps, before the stage's end
    # save_every=4 made no checkpoint yet: the stop wrote one for the last finished step
    checkpoints = run_dir / "stage1" / "checkpoints"
    assert (checkpoints / f"step_{stopped}" / "controller.pt").is_file()
    assert re.search(rf"stopped after step {stopped} of {STEPS} \(checkpoint .*step_{stopped}\)", err)
    assert not (run_dir / "stage1" / "final").exists()

    again = resume_line(err)
    assert again == args  # the same command: resume auto is the default
    run_to_end(again)
    assert metrics(run_dir) == metrics(straight)
    assert_same_weights(weights(straight / "stage1" / "final"), weights(run_dir / "stage1" / "final"))
    samples = (run_dir / "stage1" / "samples" / f"step_{STEPS}.jsonl").read_text().splitlines()
    # the first 4 responses, then the step's slowest-scored rows not among them
    assert 4 <= len(samples) <= 4 + SLOWEST_ROWS and {"response", "ground_truth", "score", "reason"} <= set(
        json.loads(samples[0])
    )


@pytest.mark.slow
def test_sigterm_during_start_up_exits_143_and_the_rerun_ends_like_an_uninterrupted_run(
    tmp_path: Path, straight: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    args = train_args(run_dir, tiny_model_dir, tiny_data_dir)
    code, err = interrupt(args, run_dir, signal.SIGTERM, "start")

    assert code == 143, err[-3000:]
    assert "Traceback" not in err and "no step finished" in err
    run_to_end(resume_line(err))
    assert metrics(run_dir) == metrics(straight)
    assert_same_weights(weights(straight / "stage1" / "final"), weights(run_dir / "stage1" / "final"))


@pytest.mark.slow
def test_a_second_ctrl_c_exits_at_once_and_the_rerun_still_ends_like_an_uninterrupted_run(
    tmp_path: Path, straight: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    run_dir = tmp_path / "run"
    args = train_args(run_dir, tiny_model_dir, tiny_data_dir)
    code, err = interrupt(args, run_dir, signal.SIGINT, "step", times=2)

    assert code == 130, err[-3000:]
    assert "interrupted again: exiting now" in err and "to resume" not in err
    run_to_end(args)
    assert metrics(run_dir) == metrics(straight)
    assert_same_weights(weights(straight / "stage1" / "final"), weights(run_dir / "stage1" / "final"))
