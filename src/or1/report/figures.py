"""The run's figures: one step axis across stages, stage boundaries marked, each panel a small function.

Drawn with matplotlib's Agg canvas straight into PNG files (no display, no pyplot state), from a RunFiles only. The
curves over steps are here; the bar charts per stage or per model (`OTHER_PANELS`) are `or1.report.bars`'.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from or1.report.bars import draw_eval, draw_online_filter
from or1.report.runfiles import RunFiles
from or1.run_metrics import (
    ENTROPY,
    ENTROPY_COEF,
    ENTROPY_TARGET,
    GENERATE_TOKENS_PER_S,
    LENGTH_MAX,
    LENGTH_MEAN,
    MISMATCH_ABS_DIFF_MAX,
    MISMATCH_ABS_DIFF_MEAN,
    MISMATCH_K3_KL,
    REJECTED_FRAC,
    REWARD_MEAN,
    SAMPLED_ENTROPY,
    SOLVE_ALL_FRAC,
    SOLVE_NONE_FRAC,
    STEP,
    STEP_SECONDS,
    TRUNCATED_FRAC,
    UPDATE_MFU,
    UPDATE_TOKENS_PER_S,
    VALIDATION_ACCURACY,
    VALUE_LOSS,
    ability_reward_mean,
    is_training_step,
    phase_seconds,
    validation_truncated,
)

STEP_LABEL = "training step (all stages)"
# The seconds of a step by phase, bottom to top; what they leave of time/step is drawn as "other".
PHASES = ("generate", "reward", "old_log_prob", "ref_log_prob", "values", "update", "critic_update")


@dataclass(frozen=True)
class Panel:
    name: str  # the PNG's file stem
    title: str
    draw: Callable[[Axes, RunFiles], bool]  # False: nothing to draw from this run (yet)


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average over `window` points (shorter at the start)."""
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def window_for(run: RunFiles) -> int:
    """About 1/40 of the run's trained steps: enough to see a trend through per-step noise."""
    steps = sum(1 for s in run.stages for r in s.records if is_training_step(r))
    return max(1, steps // 40)


def mark_stages(ax: Axes, run: RunFiles) -> None:
    """Shade every other stage, draw each boundary, and name each stage with its response budget."""
    for i, stage in enumerate(run.stages):
        if i % 2:
            ax.axvspan(stage.offset, stage.end, color="0.93", zorder=0)
        if i:
            ax.axvline(stage.offset, color="0.45", linestyle="--", linewidth=0.9, zorder=1)
        budget = f" ({stage.budget} tok)" if stage.budget else ""
        ax.text(  # just above the plot area, where no curve or legend goes
            stage.offset + 0.005 * max(run.stages[-1].end, 1),
            1.005,
            f"stage {stage.name}{budget}",
            transform=ax.get_xaxis_transform(),
            va="bottom",
            fontsize=8,
            color="0.3",
        )


def _line(ax: Axes, run: RunFiles, key: str, label: str, color: str, window: int = 1) -> bool:
    """Draw `key` across stages (raw faintly, smoothed on top when window > 1); False when never logged."""
    drawn = False
    for stage in run.stages:
        steps, values = stage.series(key)
        if not steps:
            continue
        first = not drawn
        if window > 1:
            ax.plot(steps, values, color=color, alpha=0.2, linewidth=0.8)
            values = smooth(values, window)
        ax.plot(steps, values, color=color, linewidth=1.6, label=label if first else None)
        drawn = True
    return drawn


def draw_validation(ax: Axes, run: RunFiles) -> bool:
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    keys = run.validation_keys()
    for key, color in zip(keys, colors * 4, strict=False):
        m = VALIDATION_ACCURACY.match(key)
        assert m is not None
        label = f"{run.set_subject(m['set'])}: avg@{m['n']} at T={m['temperature']}"
        for stage in run.stages:
            steps, values = stage.series(key)
            ax.plot(steps, [100 * v for v in values], "o-", color=color, markersize=4)
        ax.plot([], [], "o-", color=color, label=label)
    budgets = {s.validation_budget for s in run.stages if s.validation_budget}
    budget = f", {budgets.pop()}-token budget" if len(budgets) == 1 else ""
    ax.set_ylabel(f"validation accuracy (%{budget})")
    return bool(keys)


ABILITY_COLORS = {"math": "tab:blue", "code": "tab:orange"}


def draw_reward(ax: Axes, run: RunFiles) -> bool:
    """The training reward, and each ability's apart when a run trains more than one (math/..., code/...)."""
    window = window_for(run)
    drawn = _line(ax, run, REWARD_MEAN, "all (truncated = 0)", "tab:green", window)
    for ability, color in ABILITY_COLORS.items():
        _line(ax, run, ability_reward_mean(ability), ability, color, window)
    ax.set_ylabel("mean training reward (0-1)")
    return drawn


def draw_length(ax: Axes, run: RunFiles) -> bool:
    window = window_for(run)
    drawn = _line(ax, run, LENGTH_MAX, "max", "tab:red", window)
    drawn = _line(ax, run, LENGTH_MEAN, "mean", "tab:blue", window) or drawn
    for i, stage in enumerate(run.stages):
        if stage.budget:
            label = "stage budget" if i == 0 else None
            ax.hlines(stage.budget, stage.offset, stage.end, colors="black", linestyles=":", label=label)
    ax.set_ylabel("response length (tokens)")
    return drawn


def draw_truncation(ax: Axes, run: RunFiles) -> bool:
    drawn = False
    for stage in run.stages:
        steps, values = stage.series(TRUNCATED_FRAC)
        if steps:
            smoothed = smooth([100 * v for v in values], window_for(run))
            ax.plot(steps, smoothed, color="tab:red", label="training" if not drawn else None)
            drawn = True
    for key in run.validation_keys():
        truncated = validation_truncated(key)
        for i, stage in enumerate(run.stages):
            steps, values = stage.series(truncated)
            label = f"validation {key.split('/')[1]}" if i == 0 else None
            ax.plot(steps, [100 * v for v in values], "s--", color="tab:gray", markersize=4, label=label)
    ax.set_ylabel("truncated responses (%)")
    return drawn


def draw_entropy(ax: Axes, run: RunFiles) -> bool:
    window = window_for(run)
    drawn = _line(ax, run, SAMPLED_ENTROPY, "sampled-token entropy", "tab:purple", window)
    _line(ax, run, ENTROPY, "full-vocabulary entropy", "tab:pink", window)
    for i, stage in enumerate(run.stages):
        steps, targets = stage.series(ENTROPY_TARGET)
        if steps:
            ax.plot(steps, targets, color="black", linestyle=":", label="target" if i == 0 else None)
    ax.set_ylabel("entropy (nats / token)")
    coef = ax.twinx()
    for stage in run.stages:
        steps, values = stage.series(ENTROPY_COEF)
        coef.plot(steps, values, color="tab:orange", linewidth=1.4)
    note = flat_coefficient_note(run)  # in the legend: where the reader looks for what the line is
    ax.plot([], [], color="tab:orange", label="coefficient (right axis)" + (f",\n{note}" if note else ""))
    coef.set_ylabel("entropy loss coefficient", color="tab:orange")
    coef.set_ylim(bottom=0)
    return drawn


def flat_coefficient_note(run: RunFiles) -> str | None:
    """Why the entropy coefficient never moved in this run (from the stages' algorithm.entropy), None if it did."""
    values = {v for stage in run.stages for v in stage.series(ENTROPY_COEF)[1]}
    if len(values) != 1:
        return None
    value, settings = values.pop(), run.stages[-1].entropy
    mode = settings.get("mode", "adaptive")
    if mode != "adaptive":
        return f"flat at {value:g}: algorithm.entropy.mode is {mode}"
    if value == 0:
        return f"flat at 0: entropy never fell below its target {settings.get('target', '?')}"
    if value == settings.get("max_coef"):
        return f"flat at its cap max_coef={value:g}: entropy stayed below its target"
    return f"flat at {value:g}"


def draw_rejection(ax: Axes, run: RunFiles) -> bool:
    window = window_for(run)
    drawn = False
    for key, label, color in (
        (REJECTED_FRAC, "groups rejected (no reward variance)", "black"),
        (SOLVE_ALL_FRAC, "of which all correct", "tab:green"),
        (SOLVE_NONE_FRAC, "of which all wrong", "tab:red"),
    ):
        for stage in run.stages:
            steps, values = stage.series(key)
            if steps:
                ax.plot(steps, smooth([100 * v for v in values], window), color=color, label=label)
                drawn, label = True, None
    ax.set_ylabel("groups per step (%)")
    return drawn


def draw_time(ax: Axes, run: RunFiles) -> bool:
    window = window_for(run)
    phases = [p for p in PHASES if run.has(phase_seconds(p))]
    colors = ["tab:blue", "tab:green", "tab:orange", "tab:olive", "tab:cyan", "tab:red", "tab:pink"]
    drawn = False
    for stage in run.stages:
        rows = [r for r in stage.records if is_training_step(r) and STEP_SECONDS in r]
        if not rows:
            continue
        steps = [stage.offset + int(r[STEP]) for r in rows]
        parts = [smooth([float(r.get(phase_seconds(p), 0.0)) for r in rows], window) for p in phases]
        total = smooth([float(r[STEP_SECONDS]) for r in rows], window)
        other = [max(t - sum(col), 0.0) for t, *col in zip(total, *parts, strict=True)]
        labels = [*phases, "other"] if not drawn else [None] * (len(phases) + 1)
        ax.stackplot(steps, *parts, other, labels=labels, colors=[*colors[: len(phases)], "0.7"])
        drawn = True
    ax.set_ylabel("seconds per step")
    return drawn


def draw_throughput(ax: Axes, run: RunFiles) -> bool:
    """Generated and update tokens per second (all devices), and the update's MFU on the right axis."""
    window = window_for(run)
    drawn = _line(ax, run, GENERATE_TOKENS_PER_S, "generation", "tab:blue", window)
    drawn = _line(ax, run, UPDATE_TOKENS_PER_S, "update (prompt + response)", "tab:red", window) or drawn
    ax.set_ylabel("tokens per second (all devices)")
    if run.has(UPDATE_MFU):
        mfu = ax.twinx()
        for stage in run.stages:
            steps, values = stage.series(UPDATE_MFU)
            mfu.plot(
                steps, smooth([100 * v for v in values], window), color="black", linestyle=":", linewidth=1.2
            )
        ax.plot([], [], color="black", linestyle=":", label="update MFU (right axis)")
        mfu.set_ylabel("update MFU (%)")
        mfu.set_ylim(bottom=0)
    return drawn


def draw_value_loss(ax: Axes, run: RunFiles) -> bool:
    drawn = _line(ax, run, VALUE_LOSS, "value loss", "tab:brown", window_for(run))
    ax.set_ylabel("critic value loss (squared error)")
    return drawn


def draw_mismatch(ax: Axes, run: RunFiles) -> bool:
    """The sampler / trainer gap per token (|log pi_actor - log pi_sampler|), on a log scale: ~1e-7 between two
    float32 sides, orders of magnitude more for a 16-bit or vLLM sampler."""
    window = window_for(run)
    drawn = _line(ax, run, MISMATCH_ABS_DIFF_MEAN, "mean |log-prob gap|", "tab:purple", window)
    drawn = _line(ax, run, MISMATCH_ABS_DIFF_MAX, "max |log-prob gap|", "tab:gray", window) or drawn
    drawn = _line(ax, run, MISMATCH_K3_KL, "k3 KL(sampler || actor)", "tab:olive", window) or drawn
    if drawn:
        ax.set_yscale("log")
    ax.set_ylabel("nats per token")
    return drawn


STEP_PANELS = (
    Panel("validation", "Validation accuracy", draw_validation),
    Panel("reward", "Training reward", draw_reward),
    Panel("response_length", "Response length", draw_length),
    Panel("truncation", "Truncated responses", draw_truncation),
    Panel("entropy", "Entropy and adaptive entropy control", draw_entropy),
    Panel("rejection", "Rejection sampling", draw_rejection),
    Panel("step_time", "Seconds per step by phase", draw_time),
    Panel("throughput", "Throughput and MFU", draw_throughput),
    Panel("value_loss", "Critic value loss (GAE)", draw_value_loss),
    Panel("mismatch", "Sampler vs trainer log-probs", draw_mismatch),
)
OTHER_PANELS = (
    Panel("online_filter", "Online filter: prompts per stage", draw_online_filter),
    Panel("eval", "Evaluation of the run's models", draw_eval),
)
# The one-glance figure (docs/reading-a-run.md): the curves that say whether a run learns like the paper's.
OVERVIEW = ("validation", "reward", "response_length", "entropy")


def render(panel: Panel, run: RunFiles, path: Path) -> bool:
    """Draw one panel into its own PNG; False (and no file) when the run has nothing for it yet."""
    fig = Figure(figsize=(8, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if not panel.draw(ax, run):
        return False
    _finish(ax, panel, run)
    fig.savefig(path)
    return True


def render_overview(run: RunFiles, path: Path) -> bool:
    """The OVERVIEW panels in a 2 x 2 grid, titled with the run's recipe."""
    panels = [p for p in STEP_PANELS if p.name in OVERVIEW]
    fig = Figure(figsize=(12, 7), dpi=80, layout="constrained")
    FigureCanvasAgg(fig)
    axes = list(fig.subplots(2, 2).flat)
    drawn = [p.draw(ax, run) for p, ax in zip(panels, axes, strict=True)]
    if not any(drawn):
        return False
    for panel, ax in zip(panels, axes, strict=True):
        _finish(ax, panel, run)
    fig.suptitle(f"{run.recipe} ({run.path})", fontsize=12)
    fig.savefig(path)
    return True


def _finish(ax: Axes, panel: Panel, run: RunFiles) -> None:
    ax.set_title(panel.title, pad=16 if panel in STEP_PANELS else 6)
    ax.grid(alpha=0.3)
    if panel in STEP_PANELS:
        ax.set_xlabel(STEP_LABEL)
        ax.set_xlim(0, max(run.stages[-1].end, 1) if run.stages else 1)
        mark_stages(ax, run)
    if ax.get_legend() is None and ax.get_legend_handles_labels()[0]:  # a panel may place its own
        ax.legend(fontsize=8, loc="best")
