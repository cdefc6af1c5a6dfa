"""bench/gpu_e2e.py: its CPU rehearsal end to end (every section ok, a result line each, the summary table), and the
resume check's judgement on run folders written by hand (it must catch what a broken resume does)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from test_gpu_check import assert_dry_rows

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_e2e.py"


@pytest.fixture(scope="module")
def e2e():
    spec = importlib.util.spec_from_file_location("gpu_e2e", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_e2e"] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    yield module
    del sys.modules["gpu_e2e"]


def write_run(run_dir: Path, rows: dict[int, dict], responses: dict[int, list[str]]) -> Path:
    stage = run_dir / "stage1"
    (stage / "samples").mkdir(parents=True)
    lines = [json.dumps({"step": 0, "val/x/t1/avg@5": 0.5})] + [
        json.dumps({"step": s, **r}) for s, r in rows.items()
    ]
    (stage / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    for step, texts in responses.items():
        rows_out = [json.dumps({"prompt_key": f"p{i // 2}", "response": t}) for i, t in enumerate(texts)]
        (stage / "samples" / f"step_{step}.jsonl").write_text("\n".join(rows_out) + "\n")
    return run_dir


def step_row(step: int, shift: float = 0.0) -> dict:
    return {
        "reward/mean": 0.25 + step / 100 + shift,
        "actor/pg_loss": 0.001 * step + shift,
        "time/step": 3.0 + step,
    }


def runs(tmp_path: Path, e2e, *, resumed_shift: float = 0.0, resumed_texts: list[str] | None = None):
    steps = range(1, e2e.STEPS + 1)
    texts = [f"answer {i}" for i in range(8)]
    straight = write_run(tmp_path / "a", {s: step_row(s) for s in steps}, {s: texts for s in steps})
    resumed_rows = {s: step_row(s, resumed_shift if s > 3 else 0.0) | {"time/step": 9.9} for s in steps}
    resumed = write_run(tmp_path / "b", resumed_rows, {s: resumed_texts or texts for s in steps})
    before = {s: {"step": s, **step_row(s), "time/step": 9.9} for s in range(1, 4)}
    return straight, resumed, before


def test_an_exact_resume_passes_and_timing_keys_are_left_out(tmp_path, e2e):
    straight, resumed, before = runs(tmp_path, e2e)
    result = e2e.compare_runs(straight, resumed, before, cpu=True)
    assert result == {"same_responses": 1.0, "resumed_max_abs_diff": 0.0, "exact": True}


def test_a_step_rewritten_by_the_resume_fails(tmp_path, e2e):
    straight, resumed, before = runs(tmp_path, e2e)
    before[2]["reward/mean"] = 0.99  # what the interrupted run logged before the stop
    with pytest.raises(e2e.Failed, match="step 2 was rewritten by the resume"):
        e2e.compare_runs(straight, resumed, before, cpu=True)


def test_on_the_cpu_any_difference_after_the_resume_fails(tmp_path, e2e):
    straight, resumed, before = runs(tmp_path, e2e, resumed_shift=1e-7)
    with pytest.raises(e2e.Failed, match="step 4 reward/mean"):
        e2e.compare_runs(straight, resumed, before, cpu=True)


def test_on_cuda_rounding_passes_and_a_lost_sampler_state_fails(tmp_path, e2e):
    straight, resumed, before = runs(tmp_path / "close", e2e, resumed_shift=1e-4)
    assert e2e.compare_runs(straight, resumed, before, cpu=False)["exact"] is False
    one_token_off = [f"answer {i}" for i in range(7)] + ["answer 7 but longer"]  # 7 of 8: under 90%
    straight, resumed, before = runs(tmp_path / "lost", e2e, resumed_texts=one_token_off)
    with pytest.raises(e2e.Failed, match="88% of 8 responses"):
        e2e.compare_runs(straight, resumed, before, cpu=False)


def test_an_overrun_section_is_reported_as_timeout_and_the_rest_still_run(tmp_path, e2e, monkeypatch):
    def slow(section, cpu):
        section.wait(section.start([sys.executable, "-c", "import time; time.sleep(60)"])[0])

    monkeypatch.setitem(e2e.SECTIONS, "doctor", slow)
    monkeypatch.setitem(e2e.BUDGETS, "doctor", (1, 1))
    result = e2e.run_section("doctor", tmp_path, cpu=True)
    assert result["status"] == "timeout" and result["seconds"] < 30


@pytest.mark.timeout(1200)
def test_the_cpu_rehearsal_runs_every_section(tmp_path):
    """The whole check on the CPU, as a GPU node runs it: kit, doctor, pytest -m gpu, the tiny world's train with a
    Ctrl-C and a resume checked against a straight run, stage 2, eval and report, the shapes. With three times the
    budgets: a test asserts no wall-clock time (the rehearsal's own 5 minutes are measured in bench/README.md)."""
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path), "--cpu", "--budget-scale", "3"],
        capture_output=True,
        text=True,
        timeout=1150,
    )
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["section"] for r in results] == ["kit", "doctor", "pytest", "tiny", "eval", "shapes"]
    assert done.returncode == 0, done.stdout[-3000:]
    by_name = {r["section"]: r for r in results}
    assert by_name["tiny"]["exact"] is True and by_name["tiny"]["same_responses"] == 1.0
    assert by_name["tiny"]["stopped_after"] >= 3
    assert by_name["pytest"]["failed"] == 0
    assert "| tiny | ok |" in done.stdout
    # the shapes: bench/gpu_check.py's whole dry matrix with both engines, its table in the section's log
    rows = [json.loads(line) for line in (tmp_path / "shapes.jsonl").read_text().splitlines()]
    assert_dry_rows(rows, ("hf", "vllm"))
    log = next((tmp_path / "logs").glob("shapes-*.log")).read_text()
    assert "| dry | step | 16 | on | ok |" in log and "  vllm: rollout" in log
