"""The stage summary: what one stage did, in summary.json beside its metrics and as a few console lines.

Built from the stage's metrics.jsonl (so a resumed stage summarises all of its steps, not only the last process's),
its prompt statistics and the online filter's counts.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from or1.algos.online_filter import PromptStats
from or1.config.schema import HealthConfig
from or1.health import Advisor
from or1.layout import METRICS_FILE, SUMMARY_FILE

# Metrics summarised as first / last / mean / min / max over the stage's trained steps.
CURVES = (
    "reward/mean",
    "batch/rejected_frac",
    "reward/solve_all_frac",
    "reward/solve_none_frac",
    "entropy/coef",
    "actor/entropy",
    "response/length_mean",
    "response/truncated_frac",
    "critic/vf_loss",
)


def stage_summary(
    stage_dir: Path,
    facts: dict[str, Any],
    prompt_stats: PromptStats,
    health: HealthConfig,
) -> dict[str, Any]:
    """`facts` (recipe, stage, start and final models, prompt counts) plus curves, validation, solve counts and
    the run-health advisories the stage's metrics fire."""
    records = [json.loads(line) for line in (stage_dir / METRICS_FILE).read_text().splitlines() if line]
    steps = [r for r in records if "batch/sampled" in r]
    curves = {}
    for key in CURVES:
        values = [float(r[key]) for r in steps if key in r]
        if values:
            curves[key] = {
                "first": values[0],
                "last": values[-1],
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
            }
    validation: dict[str, dict[str, float]] = {}
    for r in records:
        for key, value in r.items():
            if key.startswith("val/"):
                validation.setdefault(key, {"start": value, "start_step": r["step"]})
                validation[key].update(end=value, end_step=r["step"])
    rates = [prompt_stats.solved[u] / n for u, n in prompt_stats.attempts.items() if n]
    return {
        **facts,
        "steps": len(steps),
        "skipped_steps": sum(1 for r in steps if r.get("skipped")),
        "prompts_sampled": len(prompt_stats),
        "prompts_always_solved": sum(1 for r in rates if r == 1.0),
        "prompts_never_solved": sum(1 for r in rates if r == 0.0),
        "response_tokens": sum(float(r.get("response/tokens", 0.0)) for r in steps),
        "seconds": sum(float(r.get("time/step", 0.0)) for r in steps),
        "curves": curves,
        "validation": validation,
        "advisories": [a.as_dict() for a in Advisor.replaying(records, health).fired],
    }


def write_summary(stage_dir: Path, summary: dict[str, Any]) -> Path:
    path = stage_dir / SUMMARY_FILE
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """A few human lines: steps, reward and rejection, entropy coefficient, validation start -> end."""
    c = summary["curves"]

    def span(key: str, fmt: str) -> str:
        if key not in c:
            return "n/a"
        return f"{c[key]['first']:{fmt}} -> {c[key]['last']:{fmt}}"

    lines = [
        f"stage {summary['stage']}: {summary['steps']} steps ({summary['skipped_steps']} skipped), "
        f"{summary['prompts_sampled']} prompts sampled, {summary['prompts_always_solved']} always solved, "
        f"{summary['prompts_never_solved']} never",
        f"  reward {span('reward/mean', '.2f')}, rejected groups "
        f"{c['batch/rejected_frac']['mean']:.0%} on average, entropy coef {span('entropy/coef', '.4f')}"
        if "batch/rejected_frac" in c
        else "  no trained step",
    ]
    for key, v in summary["validation"].items():
        if "/avg@" in key:
            lines.append(
                f"  {key}: {v['start']:.1%} (step {v['start_step']}) -> {v['end']:.1%} (step {v['end_step']})"
            )
    advisories = summary.get("advisories", [])
    lines.append(
        f"  health: {len(advisories)} advisories" + (" (summary.json, or1 report)" if advisories else "")
    )
    return lines
