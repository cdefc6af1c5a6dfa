"""`or1 doctor` ends with one verdict line: what this machine can run, from what it found."""

from __future__ import annotations

from typer.testing import CliRunner

from or1.cli import app
from or1.doctor import Check, verdict

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
