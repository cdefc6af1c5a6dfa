"""A rank's process dies mid-stage (SIGKILL, as a native crash or the OOM killer would): `or1 train` restarts the
workers from the latest checkpoint by itself and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from run_files import descendants, tiny_run, wait_for_checkpoint

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
STEPS = 3


def command(run_dir: Path, model_dir: Path, data_dir: Path) -> list[str]:
    overrides = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        "data.validation.sets=[]",
        f"trainer.steps={STEPS}",
        "trainer.save_every=1",
    )
    sets = [x for o in overrides for x in ("--set", o)]
    cli = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--stage", "1"]
    return [*cli, "--run-dir", str(run_dir), "--resume", "never", *sets]


def rank_actor_pids(root: int) -> list[int]:
    pids = []
    for pid in descendants(root):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::RankActor"):
                pids.append(pid)
        except OSError:
            continue
    return pids


def metrics(run_dir: Path) -> list[dict]:
    lines = (run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if not k.startswith(("time/", "perf/"))} for x in lines]


def test_a_killed_rank_is_restarted_from_the_latest_checkpoint(
    tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    straight, crashed = tmp_path / "straight", tmp_path / "crashed"
    done = subprocess.run(command(straight, tiny_model_dir, tiny_data_dir), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]

    proc = subprocess.Popen(
        command(crashed, tiny_model_dir, tiny_data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        wait_for_checkpoint(proc, crashed, 1, timeout=300)
        victims = rank_actor_pids(proc.pid)
        assert len(victims) == 2, victims  # the two data-parallel actor ranks
        os.kill(min(victims), signal.SIGKILL)  # the first spawned
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out[-3000:]
    assert "restarting the workers from the latest checkpoint (restart 1 of at most 2)" in out
    assert "resuming stage 1 from" in out
    assert metrics(crashed) == metrics(straight)
    assert [m["step"] for m in metrics(crashed)] == list(range(1, STEPS + 1))
