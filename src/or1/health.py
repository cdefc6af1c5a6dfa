"""Run health: a small rule set over a stage's per-step metrics that says, once, when something goes wrong.

Each rule reads the metrics a step logs (metrics.jsonl's records, in step order) and fires at most once per stage
with one line that names the metric, its value and what to try. The thresholds are `trainer.health` settings
(`config.schema.HealthConfig`, documented there). The trainer prints each advisory as it fires; the stage summary
replays the stage's metrics.jsonl through the same rules (so a resumed stage lists what the whole stage showed) and
`or1 report` lists them from summary.json.

Windows compare means over `window` steps: the latest against the first of the stage (what is "rising" or
"falling"), so one noisy step never fires a rule.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

from or1.config.schema import HealthConfig
from or1.run_metrics import (
    ENTROPY,
    MISMATCH_K3_KL,
    REJECTED_FRAC,
    SLOWEST_ROW_SECONDS,
    STALENESS_MAX,
    STEP,
    TOKENS_PER_S,
    TRUNCATED_FRAC,
    is_validation_accuracy,
    phase_seconds,
)


@dataclass(frozen=True)
class Advisory:
    """One rule that fired: at which step, on which metric and value, and what to try."""

    rule: str
    step: int
    metric: str
    value: float
    advice: str

    def line(self) -> str:
        return f"health: step {self.step}: {self.metric} = {self.value:.4g}: {self.advice}"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class History:
    """The values of each metric so far, by step (only steps that logged it; NaN left out, infinities kept)."""

    values: dict[str, list[float]] = field(default_factory=dict)
    steps: int = 0

    def add(self, record: Mapping[str, object]) -> None:
        self.steps += 1
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
                self.values.setdefault(key, []).append(float(value))

    def latest(self, key: str, window: int) -> float | None:
        """The mean of the last `window` values (None before there are that many)."""
        values = self.values.get(key, [])
        return statistics.fmean(values[-window:]) if len(values) >= window else None

    def first(self, key: str, window: int) -> float | None:
        """The mean of the first `window` values, once the latest window no longer overlaps them."""
        values = self.values.get(key, [])
        return statistics.fmean(values[:window]) if len(values) >= 2 * window else None


# A rule: (history, settings) -> (metric, value, advice) when it fires, else None
Rule = Callable[[History, HealthConfig], tuple[str, float, str] | None]


def zero_advantage(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    share = h.latest(REJECTED_FRAC, c.window)
    if share is not None and share >= c.zero_advantage_frac:
        return (
            REJECTED_FRAC,
            share,
            f"{share:.0%} of groups got one reward (nothing to learn from them): the data is too easy or too hard "
            "for the model; filter it (or1 prepare-data's difficulty band, algorithm.online_filter) or sample more "
            "per prompt (rollout.n)",
        )
    return None


def truncation_rising(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    key = TRUNCATED_FRAC
    now, then = h.latest(key, c.window), h.first(key, c.window)
    if now is not None and then is not None and now >= c.truncated_frac and now > then:
        return (
            key,
            now,
            f"{now:.0%} of responses hit the length budget (from {then:.0%} at the start), and a truncated response "
            "scores 0: raise rollout.max_response_length (the next stage of the curriculum) or penalise length "
            "(algorithm.overlong)",
        )
    return None


def entropy_band(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    key = ENTROPY
    now = h.latest(key, c.window)
    if now is None:
        return None
    if now < c.entropy_min:
        advice = "entropy has collapsed: the policy stopped exploring; raise algorithm.entropy's target or coefficient"
        return key, now, advice
    if now > c.entropy_max:
        advice = "entropy is exploding: lower algorithm.entropy's coefficient or the learning rate"
        return key, now, advice
    then = h.first(key, c.window)
    if then is not None and now < then * (1.0 - c.entropy_drop):
        return (
            key,
            now,
            f"entropy fell from {then:.3g} to {now:.3g} since the stage began: exploration is drying up; adaptive "
            "entropy control (algorithm.entropy.mode: adaptive) holds it at a target",
        )
    return None


def sampler_mismatch(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    key = MISMATCH_K3_KL
    if (h.latest(STALENESS_MAX, c.window) or 0.0) > 0:
        return None  # asynchronous steps sample with older weights by design: the gap is the correction's to weigh
    now = h.latest(key, c.window)
    if now is not None and now > c.mismatch_k3_kl:
        return (
            key,
            now,
            "the sampler's log-probs drift from the trainer's: check the weight push and both dtypes, and correct "
            "for it (algorithm.rollout_correction)",
        )
    return None


def reward_time_growing(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    for key in (phase_seconds("reward"), SLOWEST_ROW_SECONDS):
        now, then = h.latest(key, c.window), h.first(key, c.window)
        if now is not None and then is not None and now >= c.reward_seconds and now > c.reward_growth * then:
            return (
                key,
                now,
                f"scoring takes {now:.1f} s a step, {now / max(then, 1e-9):.1f}x the start: a slow verifier or "
                "sandbox; see the samples' score seconds, add scorers (reward.workers) or lower the tests' timeout",
            )
    return None


def throughput_falling(h: History, c: HealthConfig) -> tuple[str, float, str] | None:
    key = TOKENS_PER_S
    now, then = h.latest(key, c.window), h.first(key, c.window)
    if now is not None and then is not None and now < (1.0 - c.throughput_drop) * then:
        return (
            key,
            now,
            f"throughput fell to {now:.0f} tokens/s from {then:.0f}: look at the phase times (time/*) for the one "
            "that grew: memory pressure (offload, swapping), a slow scorer, or other work on the machine",
        )
    return None


RULES: dict[str, Rule] = {
    "zero_advantage": zero_advantage,
    "truncation": truncation_rising,
    "entropy": entropy_band,
    "mismatch": sampler_mismatch,
    "reward_time": reward_time_growing,
    "throughput": throughput_falling,
}


@dataclass
class Validations:
    """Each validation metric's values in order, for the rule that fires when one stops improving."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, record: Mapping[str, object]) -> list[str]:
        """Record the avg@k values of `record`; the keys that got a new value."""
        keys = [k for k, v in record.items() if is_validation_accuracy(k) and isinstance(v, float)]
        for key in keys:
            self.values.setdefault(key, []).append(float(record[key]))  # type: ignore[arg-type]
        return keys

    def flat(self, key: str, c: HealthConfig) -> float | None:
        """The best of the last `validation_patience` evaluations when none beat the earlier best by
        `validation_min_gain`, else None."""
        values = self.values[key]
        if len(values) <= c.validation_patience:
            return None
        earlier, recent = values[: -c.validation_patience], values[-c.validation_patience :]
        return max(recent) if max(recent) < max(earlier) + c.validation_min_gain else None


class Advisor:
    """Feeds a stage's step records to the rules in order; each rule (and each validation metric) fires once."""

    def __init__(self, config: HealthConfig):
        self.config = config
        self.history = History()
        self.validations = Validations()
        self.fired: list[Advisory] = []

    def observe(self, record: Mapping[str, object]) -> list[Advisory]:
        """The advisories this step's record fires (none when health checks are off)."""
        if not self.config.enabled:
            return []
        step = int(record.get(STEP, self.history.steps))  # type: ignore[call-overload]
        self.history.add(record)
        new = []
        done = {a.rule for a in self.fired}
        for name, rule in RULES.items():
            if name not in done and (hit := rule(self.history, self.config)) is not None:
                new.append(Advisory(name, step, *hit))
        for key in self.validations.add(record):
            rule = f"validation:{key}"
            if rule not in done and (best := self.validations.flat(key, self.config)) is not None:
                advice = (
                    f"no gain over the last {self.config.validation_patience} evaluations (best {best:.1%}): "
                    "the stage may be done (go on to the next), or try a lower learning rate or harder data"
                )
                new.append(Advisory(rule, step, key, best, advice))
        self.fired.extend(new)
        return new

    @classmethod
    def replaying(cls, records: Iterable[Mapping[str, object]], config: HealthConfig) -> Advisor:
        """An advisor that has seen `records` (a stage's metrics.jsonl so far): the summary reads its `fired`, a
        resumed trainer goes on from it without firing again what already fired."""
        advisor = cls(config)
        for record in records:
            advisor.observe(record)
        return advisor
