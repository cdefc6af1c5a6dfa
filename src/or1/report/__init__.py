"""`or1 report RUN_DIR`: the figures of a run (plots/*.png) and report.md, drawn from the run's files alone.

It reads stage<N>/config.yaml, metrics.jsonl and summary.json and eval/*/summary.json, never trainer or worker
code, so it works on a run that is still going or was interrupted: it draws what has been logged so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from or1.layout import PLOTS_DIR, REPORT_FILE

OVERVIEW_FILE = "overview.png"


@dataclass
class Report:
    markdown: Path
    figures: dict[str, Path]  # panel name -> PNG, only those with data
    missing: list[str]  # panels the run has nothing for (yet)
    gains: list[str]  # one line per benchmark evaluated at base and final: its estimates, base -> final


def write_report(run_dir: Path | str) -> Report:
    """Write <run_dir>/plots/<panel>.png, plots/overview.png and <run_dir>/report.md; returns what was written."""
    from or1.report.figures import OTHER_PANELS, STEP_PANELS, render, render_overview
    from or1.report.markdown import eval_gains, render_markdown
    from or1.report.runfiles import read_run

    run = read_run(Path(run_dir))
    plots = run.path / PLOTS_DIR
    plots.mkdir(exist_ok=True)
    drawn: dict[str, tuple[str, Path]] = {}
    missing = []
    for panel in (*STEP_PANELS, *OTHER_PANELS):
        path = plots / f"{panel.name}.png"
        if render(panel, run, path):
            drawn[panel.name] = (panel.title, path)
        else:
            path.unlink(missing_ok=True)  # an older report's figure would no longer match the files
            # the value loss is a GAE figure; runs from before the mismatch or throughput metrics have none to draw
            optional = panel.name in ("mismatch", "throughput") or (
                panel.name == "value_loss" and not any(s.advantage == "gae" for s in run.stages)
            )
            if not optional:
                missing.append(panel.name)
    figures = {name: path for name, (_, path) in drawn.items()}
    if run.stages and render_overview(run, plots / OVERVIEW_FILE):
        figures["overview"] = plots / OVERVIEW_FILE
    markdown = run.path / REPORT_FILE
    markdown.write_text(render_markdown(run, drawn, missing))
    return Report(markdown, figures, missing, eval_gains(run))


def refresh_report(run_dir: Path | str, console: Console) -> None:
    """`or1 train`'s call after each stage: redraw the report; a drawing failure is printed, the stage stands."""
    try:
        report = write_report(run_dir)
    except Exception as err:  # a finished stage's model matters more than its figures
        console.print(f"or1 report {run_dir} failed: {err!r}", style="red", markup=False)
        return
    console.print(f"report: {report.markdown} ({len(report.figures)} figures)", markup=False)
