"""`or1 doctor` ends with one verdict line: what this machine can run, from what it found."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from or1.cli import app
from or1.config.recipe import resolve
from or1.doctor import MATH_ONLY, Check, verdict

FOUND = ("python", "torch", "cuda", "vllm", "ray", "math-verify", "bubblewrap", "docker")


def checks(*missing: str) -> list[Check]:
    return [Check(name, name not in missing, "", "") for name in FOUND]


def test_the_verdict_says_what_runs_here():
    assert verdict(checks()) == (
        "verdict: this machine runs GPU and CPU recipes, with hf and vllm rollouts and code rewards in the local "
        "sandbox."
    )
    cpu = verdict(checks("cuda", "vllm", "docker"))
    assert "runs CPU recipes (stages/tiny.yaml)" in cpu and cpu.endswith("; GPU recipes need CUDA.")
    assert "hf rollouts (vllm not usable here)" in cpu and "code rewards in the local sandbox" in cpu
    assert "docker sandbox only" in verdict(checks("bubblewrap"))
    assert "math rewards only" in verdict(checks("bubblewrap", "docker"))
    assert verdict(checks("torch", "ray")).startswith(
        "verdict: or1 cannot train here yet: torch, ray missing"
    )


def test_or1_doctor_ends_with_the_verdict():
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0 and result.output.strip().splitlines()[-1].startswith("verdict: ")


def test_doctor_without_bwrap_names_the_fix_and_the_math_only_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # the sandbox finds bwrap on PATH, as doctor does
    result = CliRunner().invoke(app, ["doctor"])
    *_, note, last = result.output.strip().splitlines()
    assert result.exit_code == 0 and last.startswith("verdict: ")
    assert note.startswith("no bubblewrap: code rewards cannot run in the local sandbox")
    assert "apt-get install bubblewrap" in note and "install.sh" in note and note.endswith(MATH_ONLY)


@pytest.mark.parametrize("recipe", ["tiny", "tiny-gpu"])
def test_the_math_only_overrides_leave_no_code_rows_in_the_tiny_recipes(recipe: str):
    config = resolve(recipe, "1", MATH_ONLY.replace("--set ", "").split())
    assert config.data.train_files == ["tiny/data/train.parquet"]
    assert "code" not in str(config.data.validation.sets)
