"""What the rules read: a stage's step metrics so far (`History`) and its evaluations (`Validations`)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field

from or1.run_metrics import STEP, VALIDATION_ACCURACY, VALIDATION_PREFIX


@dataclass
class History:
    """The values of each step metric so far, in step order (only steps that logged it; NaN left out, infinities
    kept). Validation is `Validations`': a step validated or not adds the same values here."""

    values: dict[str, list[float]] = field(default_factory=dict)
    # (key, window, level) -> (windows looked at, whether one was under level): `was_under`'s memory
    _under: dict[tuple[str, int, float], tuple[int, bool]] = field(default_factory=dict)

    def add(self, record: Mapping[str, object]) -> None:
        for key, value in record.items():
            if key == STEP or key.startswith(VALIDATION_PREFIX):
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
                self.values.setdefault(key, []).append(float(value))

    def latest(self, key: str, window: int) -> float | None:
        """The mean of the last `window` values (None before there are that many)."""
        values = self.values.get(key, [])
        return statistics.fmean(values[-window:]) if len(values) >= window else None

    def was_under(self, key: str, window: int, level: float) -> bool:
        """Whether the mean of some `window` consecutive values so far was under `level` (each window looked at
        once, so a replay of a long stage stays linear)."""
        values = self.values.get(key, [])
        seen, under = self._under.get((key, window, level), (0, False))
        while not under and seen + window <= len(values):
            under = statistics.fmean(values[seen : seen + window]) < level
            seen += 1
        self._under[(key, window, level)] = (seen, under)
        return under

    def first(self, key: str, window: int) -> float | None:
        """The mean of the first `window` values, once the latest window no longer overlaps them."""
        values = self.values.get(key, [])
        return statistics.fmean(values[:window]) if len(values) >= 2 * window else None


@dataclass
class Validations:
    """The stage's evaluations in order: each one's avg@k scores (val/<set>/t<T>/avg@<n>)."""

    evaluations: list[dict[str, float]] = field(default_factory=list)

    def add(self, record: Mapping[str, object]) -> list[str]:
        """Record the avg@k values of `record`; their keys (none: not an evaluation)."""
        scores = {
            k: float(v)  # type: ignore[arg-type]
            for k, v in record.items()
            if VALIDATION_ACCURACY.match(k) and isinstance(v, (int, float))
        }
        if scores:
            self.evaluations.append(scores)
        return list(scores)

    def series(self, key: str) -> list[float]:
        return [scores[key] for scores in self.evaluations if key in scores]

    def set_scores(self, set_name: str | None) -> list[float]:
        """Each evaluation's score of one set (the mean over its temperatures), or of every set when None."""
        out = []
        for scores in self.evaluations:
            chosen = [
                v
                for k, v in scores.items()
                if set_name is None or VALIDATION_ACCURACY.match(k)["set"] == set_name
            ]
            if chosen:
                out.append(statistics.fmean(chosen))
        return out


def plateau(values: list[float], patience: int, min_gain: float) -> float | None:
    """The best of the last `patience` values when none beat the best before them by `min_gain`, else None."""
    if len(values) <= patience:
        return None
    earlier, recent = values[:-patience], values[-patience:]
    return max(recent) if max(recent) < max(earlier) + min_gain else None
