"""report.md: a table of what each stage did, the eval results with intervals, and the figures embedded."""

from __future__ import annotations

import statistics
from datetime import datetime, timezone
from pathlib import Path

from or1.report.runfiles import RunFiles, StageRun, shown_estimates
from or1.run_metrics import (
    ENTROPY_COEF,
    GENERATE_TOKENS_PER_S,
    PEAK_TFLOPS_PER_DEVICE,
    REJECTED_FRAC,
    REWARD_MEAN,
    SKIPPED,
    STEP_MFU,
    STEP_SECONDS,
    UPDATE_MFU,
    UPDATE_TFLOPS_PER_DEVICE,
    UPDATE_TOKENS_PER_S,
    VALIDATION_PREFIX,
    devices_text,
    is_training_step,
    is_validation_accuracy,
    per_device,
    phase_share,
)


def render_markdown(run: RunFiles, figures: dict[str, tuple[str, Path]], missing: list[str]) -> str:
    """The report; `figures` maps a panel name to its title and PNG path, `missing` names panels with no data."""
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"# or1 report: {run.recipe}",
        "",
        f"Run directory `{run.path}`, read {when}. Steps are counted across stages (the stage boundaries are "
        f"the dashed lines); `or1 report {run.path}` redraws it from the run's files at any time.",
        "",
    ]
    if run.stages:
        lines += ["## Stages", "", *stage_table(run), ""]
        lines += ["## Run health", "", *health_lines(run), ""]
    if any(s.series(GENERATE_TOKENS_PER_S)[0] for s in run.stages):
        lines += ["## Throughput", "", *throughput_table(run), "", *THROUGHPUT_NOTE, ""]
    if run.evals:
        lines += ["## Evaluation", "", *eval_table(run), ""]
        lines += [f"- {line}" for line in eval_gains(run)] + [""]
    if figures:
        lines += ["## Figures", ""]
        for title, path in figures.values():
            lines += [f"![{title}]({path.relative_to(run.path).as_posix()})", ""]
    if missing:
        lines += [f"Not drawn, nothing logged for them (yet): {', '.join(missing)}.", ""]
    return "\n".join(lines)


def stage_table(run: RunFiles) -> list[str]:
    rows = [
        "| stage | steps | budget (tokens) | validation % (start -> end) | reward (first -> last tenth) "
        "| rejected groups | entropy coef (end) | online filter dropped | minutes |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stage in run.stages:
        trained = [r for r in stage.records if is_training_step(r)]
        done = f"{len(trained)} of {stage.planned_steps}" if stage.planned_steps else str(len(trained))
        if ended := (stage.summary or {}).get("ended_by"):
            done += f" (until.{ended['rule']})"
        status = "" if stage.summary else " (running or interrupted)"
        tenth = max(1, len(trained) // 10)
        rewards = [float(r[REWARD_MEAN]) for r in trained if REWARD_MEAN in r]
        reward = (
            f"{statistics.fmean(rewards[:tenth]):.2f} -> {statistics.fmean(rewards[-tenth:]):.2f}"
            if rewards
            else "-"
        )
        rejected = [float(r[REJECTED_FRAC]) for r in trained if REJECTED_FRAC in r]
        coef = [float(r[ENTROPY_COEF]) for r in trained if ENTROPY_COEF in r]
        dropped = (stage.summary or {}).get("online_filter_dropped") or {}
        seconds = sum(float(r.get(STEP_SECONDS, 0.0)) for r in trained)
        rows.append(
            f"| {stage.name}{status} | {done} | {stage.budget or '-'} | {validation_span(stage)} | {reward} | "
            f"{f'{statistics.fmean(rejected):.0%}' if rejected else '-'} | "
            f"{f'{coef[-1]:.4f}' if coef else '-'} | {sum(dropped.values()) if dropped else '-'} | "
            f"{seconds / 60:.1f} |"
        )
    return rows


THROUGHPUT_NOTE = (
    "Medians over each stage's trained steps. Devices: the training ranks, and under the separate placement the "
    "rollout replicas' own (colocated, the same devices sample and train). Tokens per second: generated response "
    "tokens over the generation phase, and prompt + response tokens through the update (times its epochs) over the "
    "update phase, in all and per device (generation's over the devices that sample, the update's over the "
    "training ranks). MFU: the update's model FLOPs (forward + backward from the architecture, causal attention "
    "per sequence, no activation recompute) over the training ranks' peak, a GPU's dense bf16 datasheet figure or, "
    "on a CPU, a matmul benchmark measured at the stage's start; step MFU: generation's forward and the update's "
    "FLOPs over the whole step and every device it used. Step time: each phase's share of the step (reward: the "
    "scoring left after generation; other: log-prob passes, critic, the controller).",
)


def throughput_table(run: RunFiles) -> list[str]:
    rows = [
        "| stage | devices | generate tok/s (per device) | update tok/s (per device) | update TFLOP/s per device "
        "| MFU | step MFU | peak TFLOP/s per device | step time: generate / reward / update / other |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for stage in run.stages:
        trained = [r for r in stage.records if is_training_step(r) and not r.get(SKIPPED)]
        facts = (stage.summary or {}).get("device_peak") or {}

        def median(key: str, trained: list = trained) -> float | None:
            values = [float(r[key]) for r in trained if isinstance(r.get(key), int | float)]
            return statistics.median(values) if values else None

        def rate(key: str) -> str:
            total, each = median(key), median(per_device(key))
            return (
                "-" if total is None else f"{total:.0f} ({each:.0f})" if each is not None else f"{total:.0f}"
            )

        if median(GENERATE_TOKENS_PER_S) is None:
            continue
        tflops = median(UPDATE_TFLOPS_PER_DEVICE)
        mfu, step_mfu = median(UPDATE_MFU), median(STEP_MFU)
        shares = [median(phase_share(k)) for k in ("generate", "reward", "update", "other")]
        rows.append(
            f"| {stage.name} | {devices_text(facts) if 'devices' in facts else '-'} | "
            f"{rate(GENERATE_TOKENS_PER_S)} | {rate(UPDATE_TOKENS_PER_S)} | "
            f"{'-' if tflops is None else f'{tflops:.3g}'} | {'-' if mfu is None else f'{mfu:.1%}'} | "
            f"{'-' if step_mfu is None else f'{step_mfu:.1%}'} | "
            f"{peak_text(stage, median(PEAK_TFLOPS_PER_DEVICE))} | "
            f"{' / '.join('-' if v is None else f'{v:.0%}' for v in shares)} |"
        )
    return rows


def peak_text(stage: StageRun, logged: float | None) -> str:
    """`989.5 (datasheet, NVIDIA H100 80GB HBM3)` from summary.json, else the number the steps logged."""
    peak = (stage.summary or {}).get("device_peak") or {}
    if "tflops" in peak:
        where = "datasheet" if peak.get("source") == "table" else "measured"
        return f"{peak['tflops']:.4g} ({where}, {peak.get('device', '?')})"
    return "-" if logged is None else f"{logged:.4g}"


def health_lines(run: RunFiles) -> list[str]:
    """Each stage's advisories from its summary.json (docs/reading-a-run.md, "Run health"), or why there are none
    to show."""
    lines = []
    for stage in run.stages:
        if stage.summary is None:
            lines.append(
                f"- {stage.name}: running or interrupted (advisories are listed when the stage ends)"
            )
            continue
        if ended := stage.summary.get("ended_by"):
            lines.append(
                f"- {stage.name}: ended at step {ended['step']} by its stop rule until.{ended['rule']}: "
                f"`{ended['metric']}` = {ended['value']:.4g} ({ended['detail']})"
            )
        advisories = stage.summary.get("advisories", [])
        if not advisories:
            lines.append(f"- {stage.name}: no advisory fired")
        for a in advisories:
            lines.append(
                f"- {stage.name}, step {a['step']}: `{a['metric']}` = {a['value']:.4g}: {a['advice']}"
            )
    return lines


def validation_span(stage: StageRun) -> str:
    """`40.6 -> 48.8` per validation key (set, temperature), first and last validation of the stage."""
    spans = []
    keys = dict.fromkeys(k for r in stage.records for k in r if is_validation_accuracy(k))
    for key in keys:
        _, values = stage.series(key)
        if values:
            name = key.removeprefix(VALIDATION_PREFIX)
            spans.append(f"{name} {100 * values[0]:.1f} -> {100 * values[-1]:.1f}")
    return "; ".join(spans) or "-"


def eval_table(run: RunFiles) -> list[str]:
    rows = [
        "| model | benchmark | samples | budget (tokens) | metric | % | 95% interval |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in run.evals:
        for name, (value, low, high) in e.estimates.items():
            rows.append(
                f"| {e.label} | {e.benchmark} | {e.samples} | {e.max_tokens or '-'} | {name} | "
                f"{100 * value:.1f} | {100 * low:.1f} - {100 * high:.1f} |"
            )
    return rows


def eval_gains(run: RunFiles) -> list[str]:
    """One line per benchmark evaluated both at the base and at the final model: each estimate, base -> final,
    and what makes the two incomparable when their settings differ (or1.report.compare)."""
    from or1.report.compare import compare

    lines = []
    for benchmark in dict.fromkeys(e.benchmark for e in run.evals):
        evals = [e for e in run.evals if e.benchmark == benchmark]
        base = next((e for e in evals if e.label.startswith("base")), None)
        final = next((e for e in reversed(evals) if e.label.startswith("final")), None)
        if base is None or final is None:
            continue
        parts = [
            f"{name} {100 * base.estimates[name][0]:.1f}% -> {100 * value:.1f}% "
            f"({100 * (value - base.estimates[name][0]):+.1f} points)"
            for name, (value, _, _) in final.estimates.items()
            if name in base.estimates and name in shown_estimates(list(final.estimates))
        ]
        line = f"{benchmark}, base -> final: {'; '.join(parts)}"
        comparison = compare(base.summary, final.summary)
        if not comparison.comparable:
            line += f" ({comparison.describe()})"
        lines.append(line)
    return lines
