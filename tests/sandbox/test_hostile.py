"""Every control and hostile probe of `or1 sandbox check`, on each backend, plus the host checks that follow them.

One self-test run per backend (module-scoped); each probe is then its own test so a failure names the hole.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sandbox_backends import BACKENDS, require

from or1.rewards.code import judge_probes
from or1.sandbox.check import CheckResult, run_self_test
from or1.sandbox.probes import controls, hostile

PROBES = [p.name for p in controls() + hostile(0, "secret", "/nowhere")]
HOST_CHECKS = [
    "still_judges",
    "no_test_processes",
    "no_files_outside",
    "no_connections",
    "host_processes_alive",
    "clean_close",
]


@pytest.fixture(scope="module", params=BACKENDS)
def self_test(request: pytest.FixtureRequest) -> dict[str, CheckResult]:
    require(request.param)
    return {c.name: c for c in run_self_test(judge_probes, request.param)}


@pytest.mark.parametrize("name", PROBES + HOST_CHECKS)
def test_self_test_item(self_test: dict[str, CheckResult], name: str):
    check = self_test[name]
    assert check.passed, f"{name}: {check.detail}"


def test_self_test_covers_every_probe(self_test: dict[str, CheckResult]):
    assert sorted(self_test) == sorted(PROBES + HOST_CHECKS)


def test_frame_snooping_probe_detects_a_leak(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """With the test code left in the candidate's memory, the snooping probe must earn the reward."""
    require("local")
    import or1.sandbox.protocol as protocol
    from or1.rewards.code import prepare_problem, score_program
    from or1.sandbox.local import LocalSandbox

    leaky = tmp_path / "runner.py"
    source = protocol.RUNNER_PATH.read_text()
    assert 'hide=("test_code",)' in source
    leaky.write_text(source.replace('hide=("test_code",)', "hide=()"))
    monkeypatch.setattr(protocol, "RUNNER_PATH", leaky)
    probe = next(p for p in hostile(0, "secret", "/nowhere") if p.name == "frame_snooping")
    sandbox = LocalSandbox(0)
    try:
        result = score_program(*prepare_problem(probe.response, probe.ground_truth), sandbox, timeout=5)
    finally:
        sandbox.close()
    assert result.score == 1.0, result
