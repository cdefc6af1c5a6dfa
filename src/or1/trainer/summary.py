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
from or1.config.schema import TrainerConfig
from or1.health import Advisor
from or1.layout import METRICS_FILE, SUMMARY_FILE
from or1.run_metrics import (
    ENTROPY,
    ENTROPY_COEF,
    GENERATE_TOKENS_PER_S,
    LENGTH_MEAN,
    REJECTED_FRAC,
    RESPONSE_TOKENS,
    REWARD_MEAN,
    SKIPPED,
    SOLVE_ALL_FRAC,
    SOLVE_NONE_FRAC,
    STEP,
    STEP_MFU,
    STEP_SECONDS,
    TRUNCATED_FRAC,
    UPDATE_MFU,
    UPDATE_TOKENS_PER_S,
    VALIDATION_PREFIX,
    VALUE_LOSS,
    devices_text,
    is_training_step,
    is_validation_accuracy,
    phase_share,
    read_metrics,
)
from or1.trainer.throughput import MEDIANS

# Metrics summarised as first / last / mean / min / max over the stage's trained steps.
CURVES = (
    REWARD_MEAN,
    REJECTED_FRAC,
    SOLVE_ALL_FRAC,
    SOLVE_NONE_FRAC,
    ENTROPY_COEF,
    ENTROPY,
    LENGTH_MEAN,
    TRUNCATED_FRAC,
    VALUE_LOSS,
)


def stage_summary(
    stage_dir: Path,
    facts: dict[str, Any],
    prompt_stats: PromptStats,
    trainer: TrainerConfig,
) -> dict[str, Any]:
    """`facts` (recipe, stage, start and final models, prompt counts, the devices' peak) plus curves, validation,
    solve counts, the medians of the throughput metrics over the trained steps (`throughput`), the run-health
    advisories the stage's metrics fire and the stop rule that ended it (`ended_by`, None at trainer.steps)."""
    records = read_metrics(stage_dir / METRICS_FILE)
    steps = [r for r in records if is_training_step(r)]
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
            if key.startswith(VALIDATION_PREFIX):
                validation.setdefault(key, {"start": value, "start_step": r[STEP]})
                validation[key].update(end=value, end_step=r[STEP])
    advisor = Advisor.replaying(records, trainer.health, trainer.until)
    rates = [prompt_stats.solved[u] / n for u, n in prompt_stats.attempts.items() if n]
    return {
        **facts,
        "steps": len(steps),
        "skipped_steps": sum(1 for r in steps if r.get(SKIPPED)),
        "prompts_sampled": len(prompt_stats),
        "prompts_always_solved": sum(1 for r in rates if r == 1.0),
        "prompts_never_solved": sum(1 for r in rates if r == 0.0),
        "response_tokens": sum(float(r.get(RESPONSE_TOKENS, 0.0)) for r in steps),
        "seconds": sum(float(r.get(STEP_SECONDS, 0.0)) for r in steps),
        "curves": curves,
        "validation": validation,
        "throughput": throughput_medians([r for r in steps if not r.get(SKIPPED)]),
        "advisories": [a.as_dict() for a in advisor.fired],
        "ended_by": advisor.ended.as_dict() if advisor.ended is not None else None,
    }


def throughput_medians(steps: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each perf/ rate (trainer.throughput.MEDIANS) over `steps`, for those logged."""
    out = {}
    for key in MEDIANS:
        values = [float(r[key]) for r in steps if key in r]
        if values:
            out[key] = statistics.median(values)
    return out


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
        f"  reward {span(REWARD_MEAN, '.2f')}, rejected groups "
        f"{c[REJECTED_FRAC]['mean']:.0%} on average, entropy coef {span(ENTROPY_COEF, '.4f')}"
        if REJECTED_FRAC in c
        else "  no trained step",
    ]
    if line := throughput_line(summary):
        lines.append(line)
    for key, v in summary["validation"].items():
        if is_validation_accuracy(key):
            lines.append(
                f"  {key}: {v['start']:.1%} (step {v['start_step']}) -> {v['end']:.1%} (step {v['end_step']})"
            )
    if ended := summary.get("ended_by"):
        lines.append(
            f"  ended by {ended['rule']} at step {ended['step']}: {ended['metric']} = {ended['value']:.4g} ({ended['detail']})"
        )
    advisories = summary.get("advisories", [])
    lines.append(
        f"  health: {len(advisories)} advisories" + (" (summary.json, or1 report)" if advisories else "")
    )
    return lines


def throughput_line(summary: dict[str, Any]) -> str | None:
    """`  median tok/s: generate 2360, update 3100 (2 devices), MFU 1.2% of 0.35 TFLOP/s per device (measured on cpu
    (2 threads)); step time: generate 45%, reward 10%, update 35%, other 10%`."""
    t, peak = summary.get("throughput") or {}, summary.get("device_peak") or {}
    if GENERATE_TOKENS_PER_S not in t:
        return None
    parts = [f"  median tok/s: generate {t[GENERATE_TOKENS_PER_S]:.0f}"]
    if UPDATE_TOKENS_PER_S in t:
        parts.append(f", update {t[UPDATE_TOKENS_PER_S]:.0f}")
    if "devices" in peak:
        parts.append(f" ({devices_text(peak)})")
    if UPDATE_MFU in t and "tflops" in peak:
        where = "datasheet" if peak["source"] == "table" else "measured"
        step = f", step MFU {t[STEP_MFU]:.1%}" if STEP_MFU in t else ""
        parts.append(
            f", MFU {t[UPDATE_MFU]:.1%}{step} of {peak['tflops']:.3g} TFLOP/s per device ({where}, "
            f"{peak['device']})"
        )
    shares = [
        f"{k} {t[phase_share(k)]:.0%}"
        for k in ("generate", "reward", "update", "other")
        if phase_share(k) in t
    ]
    if shares:
        parts.append(f"; step time: {', '.join(shares)}")
    return "".join(parts)
