"""Kill a training run with SIGKILL while it writes a checkpoint, resume with --resume auto, and end exactly where
an uninterrupted run of the same steps ends (weights and every non-timing metric): in stage 1, and in stage 2,
which starts from stage 1's final model and online-filtered prompts, must leave stage 1's files alone, and ends by a
stop rule (trainer.until) whose window the resume falls into."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from or1.export import verify_export
from or1.trainer.checkpoint import CheckpointManager
from run_files import ENV, assert_same_weights, kill_while_writing, metrics, tiny_run, weights

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
STEPS = 4
# Stage 2's stop rule: validated every step, no evaluation can beat the best before it by 2 (accuracy is at most 1),
# so it fires at the third evaluation after the start's, step 3 of 4, whatever the scores.
UNTIL_STEP = 3
STAGE2_UNTIL = (
    "data.validation.every=1",
    "trainer.until.plateau.min_gain=2",
    "trainer.until.plateau.evaluations=3",
)


def command(run_dir: Path, model_dir: Path, data_dir: Path, resume: str, stage: str = "1") -> list[str]:
    overrides = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        f"trainer.steps={STEPS}",
        "trainer.save_every=1",
        "trainer.keep_checkpoints=5",
        f"data.validation.sets=[{data_dir / 'validation.parquet'}]",
        "data.validation.max_problems=8",
        *(STAGE2_UNTIL if stage == "2" else ()),
    )
    code = (
        "import sys; from pathlib import Path; from or1.trainer.launch import launch; "
        "from or1.trainer.request import TrainRequest; "
        "launch(TrainRequest(sys.argv[1], sys.argv[2], Path(sys.argv[3]), tuple(sys.argv[5:]), sys.argv[4]))"
    )
    return [sys.executable, "-c", code, RECIPE, stage, str(run_dir), resume, *overrides]


def run(cmd: list[str]) -> str:
    """Run to completion; its console output."""
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def min_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return min(float((a[name] - b[name]).abs().min()) for name in a)


def nudge_away_from(model_dir: Path, base: dict, step: float) -> None:
    """Move every weight of model_dir a further `step` away from `base` (up where they are equal).

    Stage 1's few steps may all be skipped (no group with reward variance; the weak test base solves 2-5% of its
    samples, and 3-4 of the 4 steps trained over AVX-512 / avx2 x OR1_TEST_SEED 0..2), which would leave its final
    model equal to the base or within one step of it. After the nudge stage 1's final and the base differ by at least
    `step` in every weight, on any trajectory, so which of them stage 2 loaded can be told apart.
    """
    path = model_dir / "model.safetensors"
    tensors = load_file(path)
    for name, value in tensors.items():
        away = torch.where(value >= base[name], 1.0, -1.0).to(value.dtype)
        tensors[name] = value + away * step
    save_file(tensors, path, metadata={"format": "pt"})
    # no longer the weights its export checked: without the manifest it reads as a folder from before checked exports
    (model_dir / "manifest.json").unlink()


def digest(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def filter_report(stdout: str) -> list[str]:
    return re.findall(r"^online filter: .*$", stdout, flags=re.MULTILINE)


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
    assert_same_weights(weights(straight / "stage1" / "final"), weights(killed / "stage1" / "final"))
    assert not (manager.root / "step_3.tmp").exists()  # swept on resume


# Not slow: 70-90 s on 2 cores (plus the session's tiny model, which the default suite builds anyway).
def test_stage2_killed_then_resumed_equals_uninterrupted_stage2(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    source = tmp_path / "source"
    run(command(source, tiny_model_dir, tiny_data_dir, "never"))
    # stage 1's final model was checked against the live actor before it was put in place
    manifest = verify_export(source / "stage1" / "final")
    assert manifest["source"] == f"the live actor after step {STEPS}"
    assert manifest["probe"]["transformers"]["max_abs_diff"] <= 1e-5
    lr = yaml.safe_load((source / "stage1" / "config.yaml").read_text())["actor"]["lr"]
    nudge_away_from(source / "stage1" / "final", weights(tiny_model_dir), 4 * lr)
    stage1 = digest(source / "stage1")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    for run_dir in (straight, killed):  # both stage-2 runs start from the same stage-1 final and prompt stats
        shutil.copytree(source / "stage1", run_dir / "stage1")

    straight_out = run(command(straight, tiny_model_dir, tiny_data_dir, "never", "2"))
    kill_while_writing(
        command(killed, tiny_model_dir, tiny_data_dir, "never", "2"), killed / "stage2" / "checkpoints", 3
    )
    manager = CheckpointManager(killed / "stage2", keep=5)
    assert manager.latest() == manager.root / "step_2"  # evaluations at steps 0-2 logged: the rule's window
    resumed_out = run(command(killed, tiny_model_dir, tiny_data_dir, "auto", "2"))

    assert f"resuming stage 2 from {manager.root / 'step_2'}" in resumed_out
    assert metrics(killed, "2") == metrics(straight, "2")
    assert [m["step"] for m in metrics(killed, "2")] == list(range(0, UNTIL_STEP + 1))
    for out in (straight_out, resumed_out):
        assert f"stage 2 ends at step {UNTIL_STEP} of {STEPS}: until.plateau: step {UNTIL_STEP}" in out
    assert_same_weights(weights(straight / "stage2" / "final"), weights(killed / "stage2" / "final"))
    assert not (manager.root / "step_3.tmp").exists()

    # Both runs filtered the prompts alike, from stage 1's prompt_stats.parquet, and say they started from stage 1's
    # final; stage 2 reads stage 1's files and writes nothing there.
    report = filter_report(straight_out)
    assert report and report == filter_report(resumed_out)
    dropped = re.fullmatch(r"online filter: dropped (\d+) prompts solved every time in stage 1 .*", report[0])
    assert dropped
    for run_dir in (straight, killed):
        summary = json.loads((run_dir / "stage2" / "summary.json").read_text())
        assert summary["start_model"] == str(run_dir / "stage1" / "final")
        assert summary["online_filter_dropped"] == {"stage1": int(dropped[1])}
        assert summary["steps"] == UNTIL_STEP
        assert (summary["ended_by"]["rule"], summary["ended_by"]["step"]) == ("plateau", UNTIL_STEP)
        assert digest(run_dir / "stage1") == stage1

    # Stage 2 started from stage 1's final model, not from model.path (the base, still in the overrides): one fresh
    # AdamW step moves each weight by at most lr, so its first checkpoint lies within lr of its starting weights, and
    # at least 3 lr from the base's (stage 1's final was nudged 4 lr away from them, weight by weight).
    assert yaml.safe_load((straight / "stage2" / "config.yaml").read_text())["actor"]["lr"] == lr
    first = weights(straight / "stage2" / "checkpoints" / "step_1" / "model")
    assert max_abs_diff(first, weights(source / "stage1" / "final")) <= 1.01 * lr
    assert min_abs_diff(first, weights(tiny_model_dir)) > 2.9 * lr
