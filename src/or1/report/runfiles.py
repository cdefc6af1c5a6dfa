"""Reading a run directory: each stage's resolved config, step records and summary, and the eval summaries.

Files only, never trainer or worker code: a stage still training has a config.yaml and a growing metrics.jsonl
(whose last line may be half written), an interrupted one has no summary.json, a finished one has all three.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from or1.errors import UserError
from or1.layout import CONFIG_FILE, EVAL_DIR, METRICS_FILE, STAGE_DIR, SUMMARY_FILE
from or1.run_metrics import STEP, is_validation_accuracy, read_metrics


def shown_estimates(names: list[str]) -> list[str]:
    """The estimates worth showing: pass@1 is the number avg@n already is (c / n), so it goes when avg@n is there."""
    return [n for n in names if n != "pass@1" or not any(m.startswith("avg@") for m in names)]


@dataclass
class StageRun:
    """One stage<N> folder: what its config planned and what its files recorded so far."""

    index: int
    name: str
    offset: int  # steps of the stages before it: the run-wide step is offset + step
    planned_steps: int | None
    budget: int | None  # rollout.max_response_length (tokens)
    validation_budget: int | None  # data.validation.max_response_length (tokens)
    advantage: str | None
    records: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] | None = None
    entropy: dict[str, Any] = field(default_factory=dict)  # algorithm.entropy: mode, target, max_coef, ...
    validation_sets: dict[str, str] = field(default_factory=dict)  # a set's name in the metrics -> what it is

    @property
    def last_step(self) -> int:
        return max((int(r[STEP]) for r in self.records), default=0)

    @property
    def end(self) -> int:
        """The run-wide step where this stage ends (as planned, or as far as it got when the plan is unknown)."""
        return self.offset + (self.planned_steps if self.planned_steps is not None else self.last_step)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """Run-wide steps and values of `key` in the records that have it (NaN values left out)."""
        pairs = [(self.offset + int(r[STEP]), float(r[key])) for r in self.records if _number(r.get(key))]
        return [s for s, _ in pairs], [v for _, v in pairs]


@dataclass
class EvalRun:
    """One `or1 eval` output folder under <run>/eval: its headline estimates with 95% intervals (fractions)."""

    label: str  # the folder's path under eval/: base, stage1, final, ...
    benchmark: str
    model: str
    samples: int
    max_tokens: int | None
    estimates: dict[str, tuple[float, float, float]]  # name -> (value, ci_low, ci_high)
    summary: dict[str, Any] = field(default_factory=dict)  # its summary.json (provenance: or1.report.compare)


@dataclass
class RunFiles:
    path: Path
    recipe: str
    stages: list[StageRun]
    evals: list[EvalRun]

    def has(self, key: str) -> bool:
        return any(key in r for s in self.stages for r in s.records)

    def set_subject(self, name: str) -> str:
        """What the validation set `name` measures, as its stage configs say (`validation_subject`)."""
        return next((s.validation_sets[name] for s in self.stages if name in s.validation_sets), name)

    def validation_keys(self) -> list[str]:
        """Every val/<set>/t<T>/avg@n key the run logged, in first-seen order."""
        keys: dict[str, None] = {}
        for stage in self.stages:
            for record in stage.records:
                keys.update((k, None) for k in record if is_validation_accuracy(k))
        return list(keys)


def read_run(run_dir: Path) -> RunFiles:
    """Everything or1 report draws from a run directory; a UserError when it holds no stage and no eval."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UserError(f"{run_dir} is not a directory; give a run directory such as runs/tiny")
    folders = sorted(
        (int(m.group(1)), p) for p in run_dir.iterdir() if p.is_dir() and (m := STAGE_DIR.fullmatch(p.name))
    )
    stages: list[StageRun] = []
    for index, folder in folders:
        previous = stages[-1] if stages and stages[-1].index == index - 1 else None
        stages.append(read_stage(index, folder, previous))
    evals = read_evals(run_dir / EVAL_DIR)
    if not stages and not evals:
        raise UserError(
            f"{run_dir} has no stage<N>/ or eval/ folder; give the --run-dir of an or1 train run (runs/<recipe>)"
        )
    recipe = next((s.summary["recipe"] for s in stages if s.summary and "recipe" in s.summary), run_dir.name)
    return RunFiles(run_dir, str(recipe), stages, evals)


def read_stage(index: int, folder: Path, previous: StageRun | None) -> StageRun:
    config = _read_yaml(folder / CONFIG_FILE)
    stage = config.get("stage") or {}
    rollout = config.get("rollout") or {}
    validation = (config.get("data") or {}).get("validation") or {}
    algorithm = config.get("algorithm") or {}
    # Offsets follow the steps the earlier stage really planned (a --set trainer.steps changes them).
    offset = previous.end if previous is not None else int(stage.get("start_step") or 0)
    steps = (config.get("trainer") or {}).get("steps")
    return StageRun(
        index=index,
        name=str(stage.get("name", index)),
        offset=offset,
        planned_steps=int(steps) if steps is not None else None,
        budget=rollout.get("max_response_length"),
        validation_budget=validation.get("max_response_length"),
        advantage=algorithm.get("advantage"),
        records=read_metrics(folder / METRICS_FILE),
        summary=_read_json(folder / SUMMARY_FILE),
        entropy=algorithm.get("entropy") or {},
        validation_sets=dict(validation_subject(entry) for entry in validation.get("sets") or []),
    )


def validation_subject(entry: str | dict[str, Any]) -> tuple[str, str]:
    """(the set's name in val/<set>/... keys, what it measures) of a data.validation.sets entry. A benchmark name
    says it itself; a file is named by its stem, which says little ("validation"), so its rows' ability goes first
    when the file is readable from here (the run's paths are relative to where it was trained)."""
    path = Path(str(entry.get("set") if isinstance(entry, dict) else entry))
    if path.suffix not in (
        ".parquet",
        ".jsonl",
        ".json",
    ):  # a benchmark name, as or1 eval's registry knows it
        return str(path), str(path)
    ability = _first_ability(path)
    return path.stem, f"{ability} ({path.stem})" if ability else path.stem


def _first_ability(path: Path) -> str | None:
    """The `ability` of a row file's first row (parquet or jsonl), None when it cannot be read."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            column = pq.read_table(path, columns=["ability"]).column(0)
            value = column[0].as_py() if len(column) else None
        elif path.suffix == ".jsonl":
            with path.open() as handle:
                value = json.loads(handle.readline()).get("ability")
        else:
            return None
    except Exception:  # noqa: BLE001 - missing, moved, another schema: the name alone then
        return None
    return value if isinstance(value, str) else None


def read_evals(eval_dir: Path) -> list[EvalRun]:
    """eval/<label>/summary.json (or one level deeper), base first, then stages in order, then the rest."""
    if not eval_dir.is_dir():
        return []
    found = [*eval_dir.glob(f"*/{SUMMARY_FILE}"), *eval_dir.glob(f"*/*/{SUMMARY_FILE}")]
    runs = []
    for path in found:
        summary = _read_json(path)
        estimates = ((summary or {}).get("metrics") or {}).get("estimates")
        if not estimates:
            continue
        runs.append(
            EvalRun(
                label=str(path.parent.relative_to(eval_dir)),
                benchmark=str(summary.get("benchmark", "?")),
                model=str((summary.get("model") or {}).get("path", "?")),
                samples=int(summary["metrics"].get("samples_per_problem", 0)),
                max_tokens=(summary.get("sampling") or {}).get("max_tokens"),
                estimates={k: (v["value"], v["ci_low"], v["ci_high"]) for k, v in estimates.items()},
                summary=summary,
            )
        )
    return sorted(runs, key=_eval_order)


def _eval_order(run: EvalRun) -> tuple[int, int, str]:
    name = run.label.split("/")[0]  # base, stage2, stage2-final (or1 eval's default), final, ...
    if name.startswith("base"):
        return 0, 0, run.label
    if m := STAGE_DIR.match(name):
        return 1, int(m.group(1)), run.label
    return (2, 0, run.label) if name.startswith("final") else (3, 0, run.label)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = yaml.safe_load(path.read_text())
    return data if isinstance(data, dict) else {}


def _read_json(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError:  # being rewritten right now
        return None
    return data if isinstance(data, dict) else None
