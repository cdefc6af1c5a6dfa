"""The response length a stage is expected to produce, for the plan's expected case.

In order: the recipe's `rollout.expected_response_length`; else the previous stage's mean response length, read from
its metrics.jsonl (`response/length_mean` over its last steps, the lengths the policy produces when this stage
starts); else none, and the expected case is the worst case (every response at the budget).
"""

from __future__ import annotations

from pathlib import Path

from or1.config.schema import RunConfig
from or1.layout import METRICS_FILE, stage_directory
from or1.run_metrics import LENGTH_MEAN, read_metrics

LAST_STEPS = 20  # the previous stage's last steps averaged: its lengths when it ended


def previous_stage_length(run_dir: Path, stage_index: int) -> float | None:
    """The mean response length over the last LAST_STEPS steps of stage `stage_index - 1` of `run_dir`, or None
    when there is no such stage or it logged none."""
    if stage_index < 2:
        return None
    records = read_metrics(stage_directory(run_dir, stage_index - 1) / METRICS_FILE)
    lengths = [float(r[LENGTH_MEAN]) for r in records if isinstance(r.get(LENGTH_MEAN), int | float)]
    recent = lengths[-LAST_STEPS:]
    return sum(recent) / len(recent) if recent else None


def with_expected_length(cfg: RunConfig, run_dir: Path | None) -> tuple[RunConfig, str]:
    """`cfg` with rollout.expected_response_length filled in from the previous stage where the recipe does not
    give it, and where the expected lengths come from."""
    if cfg.rollout.expected_response_length is not None:
        return cfg, "the recipe"
    found = previous_stage_length(run_dir, cfg.stage.index) if run_dir is not None else None
    if found is None:
        return cfg, "the recipe"
    out = cfg.model_copy(deep=True)
    out.rollout.expected_response_length = max(1, round(found))
    return out, f"stage {cfg.stage.index - 1}'s mean response length over its last {LAST_STEPS} steps"
