"""The run's bar charts, one bar per stage or per model rather than a curve over steps: the prompts each stage
trained on and the online filter dropped (summary.json), and the evaluations of the run's models (eval/)."""

from __future__ import annotations

from matplotlib.axes import Axes

from or1.report.runfiles import RunFiles, shown_estimates


def draw_online_filter(ax: Axes, run: RunFiles) -> bool:
    """Per stage: prompts it trained on and prompts the online filter dropped before it (summary.json)."""
    done = [s for s in run.stages if s.summary]
    if not done:
        return False
    x = list(range(len(done)))
    kept = [int(s.summary.get("train_prompts", 0)) for s in done]  # type: ignore[union-attr]
    dropped = [sum((s.summary.get("online_filter_dropped") or {}).values()) for s in done]  # type: ignore[union-attr]
    ax.bar(x, kept, color="tab:blue", label="training prompts")
    ax.bar(x, dropped, bottom=kept, color="tab:gray", label="dropped by the online filter")
    for i, (k, d) in enumerate(zip(kept, dropped, strict=True)):
        ax.text(i, k + d, f"{k} kept, {d} dropped", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, [f"stage {s.name}" for s in done])
    ax.set_ylabel("prompts")
    ax.set_ylim(top=1.15 * max(k + d for k, d in zip(kept, dropped, strict=True)))
    return True


def draw_eval(ax: Axes, run: RunFiles) -> bool:
    """Each benchmark's estimates with their 95% intervals, the run's models side by side per estimate (base,
    stages, final in pipeline order); pass@1 is left out where avg@n is drawn (the same number)."""
    if not run.evals:
        return False
    # a model is its path (base and base-code are one model on two benchmarks), named by its shortest folder name
    names: dict[str, str] = {}
    for e in run.evals:
        label = e.label.split("/")[0]
        names[e.model] = min(names.get(e.model, label), label, key=len)
    models = list(names)
    latest = {(e.model, e.benchmark): e for e in run.evals}  # one bar per model, benchmark and estimate
    groups = [  # (benchmark, estimate)
        (benchmark, name)
        for benchmark in dict.fromkeys(e.benchmark for e in run.evals)
        for name in shown_estimates(
            list(dict.fromkeys(k for e in run.evals if e.benchmark == benchmark for k in e.estimates))
        )
    ]
    width = 0.8 / len(models)
    ax.figure.set_size_inches(max(8.0, 2.5 + 0.28 * len(groups) * len(models)), 4.2)  # every bar wide enough
    colors = ["0.6", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:red", "tab:brown"]
    for j, model in enumerate(models):
        bars = [
            (g, latest[model, benchmark].estimates[name])
            for g, (benchmark, name) in enumerate(groups)
            if name in getattr(latest.get((model, benchmark)), "estimates", {})
        ]
        xs = [g + (j - (len(models) - 1) / 2) * width for g, _ in bars]
        values = [100 * v for _, (v, _, _) in bars]
        errors = [[100 * (v - lo) for _, (v, lo, _) in bars], [100 * (hi - v) for _, (v, _, hi) in bars]]
        ax.bar(
            xs,
            values,
            width * 0.95,
            yerr=errors,
            capsize=2,
            color=colors[j % len(colors)],
            label=names[model],
        )
        # upright numbers: never wider than their bar, so never into a neighbour's
        for x, value, high in zip(xs, values, errors[1], strict=True):
            ax.text(x, value + high + 1.5, f"{value:.1f}", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xticks(range(len(groups)), [name for _, name in groups], fontsize=8)
    for benchmark in dict.fromkeys(b for b, _ in groups):
        spots = [g for g, (b, _) in enumerate(groups) if b == benchmark]
        ax.text(
            sum(spots) / len(spots),
            -0.13,
            benchmark,
            transform=ax.get_xaxis_transform(),
            ha="center",
            va="top",
        )
        if spots[0]:
            ax.axvline(spots[0] - 0.5, color="0.6", linewidth=0.8)
    ax.set_ylabel("accuracy (%, 95% interval)")
    ax.set_ylim(0, 118)  # room above 100% for the numbers
    ax.set_yticks(range(0, 101, 20))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), title="model")  # beside the bars
    return True
