"""bench/gpu_check.py --dry-run: the GPU check's whole path (actor updates, the hand-off around each rollout engine,
the weight push) on the CPU at a tiny shape, with the numbers it derives checked by hand."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"
# the dry shape by hand: hidden 128, 2 layers, 2 query heads of 64 and 1 KV head, MLP 128, vocab 512, tied.
# A layer: q, k, v (with biases), o, the MLP's three matrices, two norms.
LAYER = (128 * 128 + 128) + 2 * (128 * 64 + 64) + 128 * 128 + 3 * 128 * 128 + 2 * 128
PARAMETERS = 2 * LAYER + 512 * 128 + 128  # layers, the (tied) embedding, the final norm


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(300)
def test_dry_run_goes_through_both_engines_on_the_cpu():
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=280
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    (row,) = json.loads(done.stdout.strip().splitlines()[-1])
    assert (row["shape"], row["device"], row["parameters"]) == ("dry", "cpu", PARAMETERS)
    assert row["update_tok_s"] > 0 and row["log_prob_tok_s"] > 0 and row["mfu"] is None  # no CPU peak known
    for kind in ("hf", "vllm"):
        assert row[f"{kind}_rollout_tok_s"] > 0
        # every parameter once, float32 on the CPU
        assert row[f"{kind}_pushed_gib"] == pytest.approx(PARAMETERS * 4 / 2**30, rel=1e-9)
        assert row[f"{kind}_push_s_per_gib"] > 0
    assert "dry (0M params, cpu): update" in done.stdout and "  vllm: rollout" in done.stdout
    assert row["update_plan_gib"] > 0 and "(or1 plan: " in done.stdout


def test_plan_prediction_is_beside_the_measured_peak():
    """The update's planned peak, from or1.plan's own terms, for the dry shape's float32 CPU settings."""
    gpu_check = load_script()
    planned = gpu_check.planned_update_gib(
        gpu_check.SHAPES["dry"], gpu_check.DRY_WORK["update"], on_gpu=False
    )
    # float32 parameters, gradients and two Adam moments alone are 16 bytes a parameter
    assert planned > 16 * PARAMETERS / 2**30
