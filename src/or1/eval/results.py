"""summary.json and report.md of an evaluation run: the numbers, and everything needed to reproduce them.

The summary records the model (path and content hash of its files), the data (source and hash, the date filter,
the problem limit), the protocol and the sampling settings it resolved to, the seed and how each sample's seed
derives from it, the engine build (engine, library version, dtype, tensor parallelism), the replica layout, the
or1 and library versions, and when the run started and finished. report.md is the same for humans: a headline
table with 95% bootstrap intervals, the settings that decide whether two results compare (`or1.report.compare`),
and the per-problem table.
"""

from __future__ import annotations

import hashlib
import json
import platform
from collections import Counter
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from or1 import __version__
from or1.errors import UserError
from or1.eval.metrics import Metrics
from or1.eval.samples import SampleRecord
from or1.layout import REPORT_FILE, SUMMARY_FILE
from or1.report.compare import SETTINGS, provenance
from or1.report.runfiles import shown_estimates

# How to read the headline table; the definitions are those of or1.eval.metrics.
METRIC_NOTES = (
    "avg@n: correct samples / n, averaged over problems. pass@k: the unbiased estimator "
    "1 - C(n-c, k) / C(n, k) from all n samples, so pass@1 = c / n = avg@n (as DeepSeek-R1 and Skywork-OR1 report "
    "it). first@1: the first sample of each problem alone. maj@k: the most common extracted answer among the first "
    "k samples, counted correct when the verifier judged a sample with that answer correct; samples without an "
    "answer do not vote (a problem where none has one scores 0), and a tie goes to the answer that appeared first.",
)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def model_fingerprint(model: Path | str) -> dict[str, Any]:
    """Path and sha256 over every file of a local model folder (names and bytes); a hub id is recorded as is."""
    path = Path(model)
    if not path.is_dir():
        return {"path": str(model), "sha256": None, "note": "not a local folder: hub id, content not hashed"}
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
    return {
        "path": str(path.resolve()),
        "sha256": digest.hexdigest(),
        "files": [str(f.relative_to(path)) for f in files],
    }


def environment() -> dict[str, str | None]:
    """Versions that change numbers: or1, Python, and the generation and scoring libraries."""
    versions: dict[str, str | None] = {"or1": __version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "vllm", "math-verify"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return versions


def check_not_smaller(out: Path, problems: int, samples: int) -> None:
    """A complete evaluation in `out` (its summary.json) is never replaced by one of fewer problems or samples per
    problem: a UserError naming --overwrite (the caller's way to start over there)."""
    path = out / SUMMARY_FILE
    if not path.is_file():
        return
    try:
        summary = json.loads(path.read_text())
        done = (int(summary["data"]["num_problems"]), int(summary["sampling"]["n"]))
    except (ValueError, KeyError, TypeError):
        return  # not an evaluation's summary: the sample cache's own checks speak for the folder
    if problems < done[0] or samples < done[1]:
        raise UserError(
            f"{out} holds a complete evaluation of {done[0]} problems x {done[1]} samples; this one covers "
            f"{problems} x {samples} and would replace its summary.json and report.md; choose another --out, or "
            "pass --overwrite to start over there."
        )


def discard_results(out: Path) -> None:
    """Remove `out`'s summary.json and report.md (an evaluation starting over there)."""
    for name in (SUMMARY_FILE, REPORT_FILE):
        (out / name).unlink(missing_ok=True)


def write_outputs(out: Path, summary: dict[str, Any], metrics: Metrics, records: list[SampleRecord]) -> None:
    """Write summary.json (summary + metrics + reason counts) and report.md into `out`."""
    summary = {**summary, "metrics": metrics.to_dict(), "reasons": dict(Counter(r.reason for r in records))}
    (out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
    (out / REPORT_FILE).write_text(render_markdown(summary, metrics))


def headline(out: Path) -> list[str]:
    """The lines `or1 eval` ends with, from `out`'s summary.json: what was evaluated, each estimate with its 95%
    interval, where the report is."""
    summary = json.loads((out / SUMMARY_FILE).read_text())
    s, metrics = summary["sampling"], summary["metrics"]
    lines = [
        f"{summary['benchmark']}: {metrics['num_problems']} problems x {metrics['samples_per_problem']} samples, "
        f"protocol {s['protocol']} (T={s['temperature']}, top_p={s['top_p']}, max {s['max_tokens']} tokens)"
    ]
    names = shown_estimates(list(metrics["estimates"]))
    labels = {n: f"{n} (= pass@1)" if n.startswith("avg@") and "pass@1" not in names else n for n in names}
    width = max(map(len, labels.values()))
    for name in names:
        est = metrics["estimates"][name]
        lines.append(
            f"  {labels[name]:<{width}}  {100 * est['value']:.1f}%  95% CI "
            f"{100 * est['ci_low']:.1f}-{100 * est['ci_high']:.1f}"
        )
    lines.append(f"report: {out / REPORT_FILE} (summary.json and samples.jsonl beside it)")
    return lines


def _layout(layout: dict[str, Any] | None) -> str:
    if not layout:
        return "none (every sample was cached)"
    threads = f", {layout['threads_per_replica']} threads each" if layout["threads_per_replica"] else ""
    return (
        f"{layout['replicas']} replica(s) x TP {layout['tensor_parallel_size']}{threads}, "
        f"{layout['replicas_replaced']} replaced"
    )


def render_markdown(summary: dict[str, Any], metrics: Metrics) -> str:
    """The human report: headline metrics with intervals, settings, and one line per problem."""
    s = summary["sampling"]
    settings = provenance(summary)
    lines = [
        f"# {summary['benchmark']}: {Path(summary['model']['path']).name}",
        "",
        f"{metrics.num_problems} problems x {metrics.samples_per_problem} samples, protocol `{s['protocol']}` "
        f"(T={s['temperature']}, top_p={s['top_p']}, max {s['max_tokens']} tokens, seed {s['seed']}), "
        f"engine {summary['engine']} ({settings['engine_version']}, {settings['dtype']}, tensor parallelism "
        f"{settings['tensor_parallel_size']}).",
        "",
        "| metric | value | 95% CI |",
        "|---|---|---|",
    ]
    for name, est in metrics.estimates.items():
        lines.append(f"| {name} | {100 * est.value:.1f} | {100 * est.ci_low:.1f} - {100 * est.ci_high:.1f} |")
    lines += ["", *METRIC_NOTES]
    lines += [
        "",
        f"Mean response length {metrics.mean_tokens:.1f} tokens; truncation rate {100 * metrics.truncation_rate:.1f}%.",
        f"Reasons: {', '.join(f'{k} {v}' for k, v in sorted(summary['reasons'].items()))}.",
        "",
        "## Reproduce",
        "",
        f"- model `{summary['model']['path']}` sha256 `{summary['model']['sha256']}`",
        f"- data `{summary['data']['source']}` sha256 `{summary['data']['sha256']}`; date filter: {summary['data']['date_filter']}",
        f"- or1 {summary['environment']['or1']}; started {summary['started_at']}, finished {summary['finished_at']}",
        f"- `{summary['command']}`",
        "",
        "## Provenance",
        "",
        "Two results compare when the settings marked yes agree (`or1 report A B` checks them).",
        "",
        "| setting | value | must match |",
        "|---|---|---|",
        *[f"| {key} | {settings[key]} | {'yes' if blocks else 'no'} |" for key, blocks in SETTINGS],
        f"| layout | {_layout(summary.get('layout'))} | no |",
        "",
        "## Per problem",
        "",
        "| problem | solved | mean tokens | truncated |",
        "|---|---|---|---|",
    ]
    for row in metrics.problems:
        lines.append(
            f"| {row.problem_id} | {row.num_correct}/{row.num_samples} | {row.mean_tokens:.1f} | "
            f"{100 * row.truncation_rate:.0f}% |"
        )
    return "\n".join(lines) + "\n"
