"""bench/gpu_check.py --dry-run: the GPU check's whole matrix (actor log-probs and updates per response length, with
and without checkpointing; the log-prob-only 7B stand-in; the hand-off around each rollout engine) on the CPU at
tiny shapes, with the numbers it derives checked by hand, and the budget and out-of-memory bookkeeping."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
# the dry shape by hand: hidden 128, 2 layers, 2 query heads of 64 and 1 KV head, MLP 128, vocab 512, tied.
# A layer: q, k, v (with biases), o, the MLP's three matrices, two norms.
LAYER = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 128 + 2 * 128
PARAMETERS = 2 * LAYER + 512 * 128 + 128  # layers, the (tied) embedding, the final norm
# the 7B's stand-in: MLP 256 and an untied output head
LAYER_7B = LAYER + 3 * 128 * (256 - 128)
PARAMETERS_7B = 2 * LAYER_7B + 2 * 512 * 128 + 128
# (shape, phase, response tokens, checkpointing) in the order the dry run runs them
DRY_MATRIX = [
    ("dry", "step", 16, True),
    ("dry", "step", 32, True),
    ("dry", "generate", 8, True),
    ("dry", "step", 16, False),
    ("dry", "step", 32, False),
    ("dry-7b", "log-probs", 16, None),
    ("dry-7b", "log-probs", 32, None),
]
STEP_KEYS = {"log_prob_tok_s", "log_prob_peak_gib", "log_prob_plan_gib", "log_prob_ratio", "update_tok_s"}
STEP_KEYS |= {"update_tflops", "mfu", "update_peak_gib", "update_plan_gib", "update_ratio"}


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through it
    spec.loader.exec_module(module)
    return module


def label(row: dict) -> tuple:
    return row["shape"], row["phase"], row["response_length"], row["checkpointing"]


def assert_dry_rows(rows: list[dict], engines: tuple[str, ...]) -> None:
    """The rows of a whole dry run (`--dry-run`, nothing skipped): the matrix in order, each case ok on the CPU,
    the parameter counts by hand, each rate and plan ratio there and consistent, a push of every parameter per
    engine. The CPU rehearsal of bench/gpu_e2e.py runs the dry matrix and holds its rows to this
    (tests/bench/test_gpu_e2e.py)."""
    assert [label(r) for r in rows] == DRY_MATRIX
    assert all(r["status"] == "ok" and r["device"] == "cpu" for r in rows)
    assert {r["parameters"] for r in rows if r["shape"] == "dry"} == {PARAMETERS}
    assert {r["parameters"] for r in rows if r["shape"] == "dry-7b"} == {PARAMETERS_7B}
    for r in (r for r in rows if r["phase"] == "step"):
        assert STEP_KEYS <= r.keys() and r["update_tok_s"] > 0 and r["log_prob_tok_s"] > 0
        assert r["mfu"] is None  # no CPU peak known
        assert r["update_reserved_gib"] is None and r["outside_gib"] is None  # CUDA's allocator readings
        assert r["update_ratio"] == pytest.approx(r["update_peak_gib"] / r["update_plan_gib"])
        assert r["log_prob_ratio"] == pytest.approx(r["log_prob_peak_gib"] / r["log_prob_plan_gib"])
    for r in (r for r in rows if r["phase"] == "log-probs"):  # a log-prob pass, no update
        assert r["log_prob_tok_s"] > 0 and r["log_prob_ratio"] > 0
        assert r["update_plan_gib"] is None and "update_tok_s" not in r
    (generate,) = (r for r in rows if r["phase"] == "generate")
    for kind in engines:
        assert generate[f"{kind}_rollout_tok_s"] > 0
        # every parameter once, float32 on the CPU
        assert generate[f"{kind}_pushed_gib"] == pytest.approx(PARAMETERS * 4 / 2**30, rel=1e-9)
        assert generate[f"{kind}_push_s_per_gib"] > 0


def test_a_spent_budget_starts_nothing_and_reports_every_case_skipped():
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--budget-s", "0"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    assert [label(r) for r in rows] == DRY_MATRIX  # the default engine (hf) makes a generate case too
    assert {r["status"] for r in rows} == {"skipped: budget"}
    assert all(r["log_prob_plan_gib"] > 0 for r in rows if r["phase"] != "generate")  # the plan needs no run
    assert not any("device" in r for r in rows)  # no process was started
    assert time.perf_counter() - start < 60


def test_the_real_matrix_runs_the_most_informative_cases_first():
    gpu_check = load_script()
    cases = gpu_check.matrix(["1.5b", "0.5b", "7b"], [8192, 16384], [True, False], True, gpu_check.GPU_WORK)
    assert [(c.shape, c.phase, c.response, c.checkpointing) for c in cases] == [
        ("1.5b", "step", 8192, True),
        ("1.5b", "step", 16384, True),
        ("1.5b", "generate", 256, True),
        ("0.5b", "step", 8192, True),
        ("0.5b", "step", 16384, True),
        ("0.5b", "generate", 256, True),
        ("1.5b", "step", 8192, False),
        ("1.5b", "step", 16384, False),
        ("0.5b", "step", 8192, False),
        ("0.5b", "step", 16384, False),
        ("7b", "log-probs", 8192, None),
        ("7b", "log-probs", 16384, None),
    ]


def test_plan_prediction_is_beside_the_measured_peak():
    """Each phase's planned peak, from or1.plan's own terms."""
    gpu_check = load_script()
    Case, dry, gpu = gpu_check.Case, gpu_check.DRY_WORK, gpu_check.GPU_WORK
    planned = gpu_check.planned_gib(Case("dry", "step", 16, False), dry, on_gpu=False)
    # float32 parameters, gradients and two Adam moments alone are 16 bytes a parameter
    assert planned["update_plan_gib"] > 16 * PARAMETERS / 2**30
    assert 12 * PARAMETERS / 2**30 < planned["log_prob_plan_gib"] < planned["update_plan_gib"]
    on = gpu_check.planned_gib(Case("1.5b", "step", 16384, True), gpu, on_gpu=True)
    off = gpu_check.planned_gib(Case("1.5b", "step", 16384, False), gpu, on_gpu=True)
    assert (
        on["update_plan_gib"] < off["update_plan_gib"] and on["log_prob_plan_gib"] == off["log_prob_plan_gib"]
    )
    # the 7B pass: bf16 parameters (2 bytes each, ~7.6B of them), no optimizer, well inside one 80 GB card
    seven = gpu_check.planned_gib(Case("7b", "log-probs", 16384, None), gpu, on_gpu=True)
    assert 2 * 7.6e9 / 2**30 < seven["log_prob_plan_gib"] < 60 and seven["update_plan_gib"] is None


def test_a_case_out_of_memory_is_a_row_and_the_next_case_gets_a_fresh_process(monkeypatch, tmp_path):
    """A process that ran out of CUDA memory wrote an "oom" row and stopped; the rest of its group starts again."""
    gpu_check = load_script()
    started = []

    def run_process(cases, args, folder, deadline):
        started.append([c.response for c in cases])
        if cases[0].response == 16 and cases[0].checkpointing is False:
            return [{"status": "oom", "peak_at_oom_gib": 70.0}], None
        return [{"status": "ok"} for _ in cases], None

    monkeypatch.setattr(gpu_check, "run_process", run_process)
    args = type("Args", (), {"dry_run": True, "budget_s": None})()
    cases = gpu_check.matrix(["dry"], [16, 32], [True, False], False, gpu_check.DRY_WORK)
    with open(tmp_path / "rows.jsonl", "w") as out:
        rows = gpu_check.run_matrix(cases, args, tmp_path, out)
    assert started == [[16, 32], [16, 32], [32]]  # on; off until its out-of-memory case; off's next case
    assert [r["status"] for r in rows] == ["ok", "ok", "oom", "ok"]
    assert rows[2]["update_plan_gib"] > 0 and rows[2]["update_ratio"] is None  # the plan beside the failure
