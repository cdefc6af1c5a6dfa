"""docs/train-your-own-model.md, run: its bash blocks verbatim, in order, on the tiny world standing in for the
reader's model and data, with only the sizes made small (`or1 train` two steps, `or1 eval` four problems)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "train-your-own-model.md"
# the only changes to the page's commands: sizes for a test on 2 CPU cores
SMALL = {"or1 train ": " --set trainer.steps=2", "or1 eval ": " --limit 4 --n 2 --max-tokens 64"}


def page_script() -> str:
    """The page's ```bash blocks in order, each or1 train / or1 eval line with SMALL appended."""
    blocks = re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.DOTALL)
    lines = []
    for line in "".join(blocks).splitlines():
        for start, sizes in SMALL.items():
            if line.startswith(start):
                assert "#" not in line and not line.endswith("\\"), f"cannot append sizes to: {line}"
                line += sizes
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_page_runs_from_a_model_and_data_to_an_evaluated_run(tmp_path: Path, tiny_data_dir: Path) -> None:
    script = page_script()
    assert all(f"or1 {c} " in script for c in ("prepare-data", "plan", "train", "eval", "report"))
    # what the page takes the reader to have: the checkout's stages/, a model folder and two files of problems
    (tmp_path / "stages").symlink_to(REPO / "stages")
    shutil.copytree(REPO / "src" / "or1" / "tinyworld" / "tiny-base", tmp_path / "my-model")
    for name, source, count in (("my-train", "train", 200), ("my-validation", "validation", 20)):
        rows = pq.read_table(tiny_data_dir / f"{source}.parquet").to_pylist()[:count]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    bin_dir = tmp_path / "bin"  # `or1` is this checkout's command line
    bin_dir.mkdir()
    (bin_dir / "or1").write_text(f'#!/bin/sh\nexec {sys.executable} -m or1.cli "$@"\n')
    (bin_dir / "or1").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO / "src"),
        "COLUMNS": "200",
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # what the page says each command prints
    assert "verdict: this machine runs" in output
    assert "prepared my-data: train 200 rows, validation 20 rows in my-data (report.md)" in output
    assert "fits: peak" in output and "DOES NOT FIT" not in output
    assert "step 2/2 reward" in output and "stage 1 done: final model in runs/mine/stage1/final" in output
    assert "report: runs/mine/eval/final/report.md" in output and "avg@2 (= pass@1)" in output
    assert "validation, base -> final: avg@2" in output
    assert (tmp_path / "runs" / "mine" / "plots" / "eval.png").is_file()
