"""The ledger of a data preparation and the files that tell a user what happened to every row.

Every step hands the ledger each row it looked at with its verdict (kept, or dropped for a reason), so per step and
per source `in == kept + sum(dropped)` holds by construction, and each dropped row gets one line in dropped.jsonl
with its source, its position there, the step and the reason. `write_report` turns the counts into report.json,
report.md and a PNG histogram of solve rates.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import IO, Any

from or1.atomic import write_text_atomically

DROPPED_FILE = "dropped.jsonl"


class Ledger:
    """Counts per step and source, and the dropped-row trace (see the module docstring)."""

    def __init__(self, out_dir: Path):
        self.steps: dict[str, dict[str, dict[str, Any]]] = {}
        self.sources: list[str] = []
        self.path = out_dir / DROPPED_FILE
        self._trace: IO[str] = self.path.open("w", encoding="utf-8")

    def record(
        self, step: str, source: str, index: int, reason: str | None, detail: str | None = None
    ) -> None:
        """One row seen by `step`: kept when `reason` is None, else dropped (and traced) for `reason`."""
        if source not in self.sources:
            self.sources.append(source)
        counts = self.steps.setdefault(step, {}).setdefault(
            source, {"in": 0, "kept": 0, "dropped": Counter()}
        )
        counts["in"] += 1
        if reason is None:
            counts["kept"] += 1
            return
        counts["dropped"][reason] += 1
        entry = {"source": source, "index": index, "step": step, "reason": reason}
        if detail:
            entry["detail"] = detail[:300]
        self._trace.write(json.dumps(entry, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._trace.close()

    def totals(self) -> dict[str, dict[str, Any]]:
        """Per source over the whole run: raw records in, rows kept at the end, and every drop reason."""
        first = next(iter(self.steps.values()), {})
        last = list(self.steps.values())[-1] if self.steps else {}
        totals = {}
        for source in self.sources:
            dropped: Counter[str] = Counter()
            for step in self.steps.values():
                dropped.update(step.get(source, {}).get("dropped", {}))
            kept = last.get(source, {}).get("kept", 0)
            totals[source] = {
                "in": first.get(source, {}).get("in", 0),
                "kept": kept,
                "dropped": dict(dropped),
            }
        return totals

    def as_json(self) -> dict[str, Any]:
        steps = [
            {
                "step": name,
                "sources": {
                    s: {"in": c["in"], "kept": c["kept"], "dropped": dict(sorted(c["dropped"].items()))}
                    for s, c in counts.items()
                },
            }
            for name, counts in self.steps.items()
        ]
        return {"steps": steps, "sources": self.totals()}


def write_report(out_dir: Path, name: str, ledger: Ledger, extra: dict[str, Any]) -> dict[str, Any]:
    """report.json, report.md and (when solve counts exist) solve_rates.png in `out_dir`; returns the JSON."""
    report = {"spec": name, **ledger.as_json(), **extra}
    write_text_atomically(out_dir / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    difficulty = extra.get("difficulty") or {}
    if difficulty.get("histogram"):
        plot_solve_rates(
            out_dir / "solve_rates.png",
            difficulty["histogram"],
            difficulty["n"],
            difficulty["model"],
            tuple(difficulty["keep"]),
        )
    write_text_atomically(out_dir / "report.md", _markdown(report))
    return report


def _markdown(report: dict[str, Any]) -> str:
    lines = [f"# Data report: {report['spec']}", ""]
    lines += ["## Per source (whole run)", "", "| source | in | kept | dropped |", "|---|---|---|---|"]
    for source, c in report["sources"].items():
        lines.append(f"| {source} | {c['in']} | {c['kept']} | {_reasons(c['dropped'])} |")
    for step in report["steps"]:
        lines += ["", f"## Step: {step['step']}", "", "| source | in | kept | dropped |", "|---|---|---|---|"]
        for source, c in step["sources"].items():
            lines.append(f"| {source} | {c['in']} | {c['kept']} | {_reasons(c['dropped'])} |")
    difficulty = report.get("difficulty")
    if difficulty and difficulty.get("histogram"):
        lines += ["", f"## Solve counts of {difficulty['model']} (out of {difficulty['n']})", ""]
        lines += ["| solved | problems |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in difficulty["histogram"].items()]
        lines += [
            "",
            f"Kept: solved {difficulty['keep'][0]} to {difficulty['keep'][1]} times. Counts: "
            + ", ".join(f"{how} {count}" for how, count in difficulty["from"].items())
            + ".",
            "",
            "![](solve_rates.png)",
        ]
    lines += ["", "## Outputs", "", "| file | rows |", "|---|---|"]
    lines += [f"| {k}.parquet | {v} |" for k, v in report.get("outputs", {}).items()]
    lines += ["", f"Every dropped row is listed in {DROPPED_FILE} (source, index, step, reason)."]
    return "\n".join(lines) + "\n"


def _reasons(dropped: dict[str, int]) -> str:
    return ", ".join(f"{reason} {count}" for reason, count in sorted(dropped.items())) or "-"


def plot_solve_rates(
    path: Path, histogram: dict[str, int], n: int, model: str, keep: tuple[int, int] = (0, -1)
) -> None:
    """A bar chart: how many problems the model solved k of n times, for each k; kept counts in blue."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [histogram.get(str(k), 0) for k in range(n + 1)]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    colors = ["#4c72b0" if keep[0] <= k <= keep[1] else "#b0b0b0" for k in range(n + 1)]
    ax.bar(range(n + 1), counts, color=colors)
    ax.set_xlabel(f"samples solved (of {n})")
    ax.set_ylabel("problems")
    ax.set_title(f"Solve counts of {model} (grey: dropped)")
    ax.set_xticks(range(n + 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
