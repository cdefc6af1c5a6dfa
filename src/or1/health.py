"""Run health: a small rule set over a stage's per-step metrics that says, once, when something goes wrong.

Each rule reads the metrics a step logs (metrics.jsonl's records, in step order) and fires at most once per stage
with one line that names the metric, its value and what to try. The thresholds are `trainer.health` settings
(`config.schema.HealthConfig`, documented there). The trainer prints each advisory as it fires; the stage summary
replays the stage's metrics.jsonl through the same rules (so a resumed stage lists what the whole stage showed) and
`or1 report` lists them from summary.json.

Windows compare means over `window` steps: the latest against the first of the stage (what is "rising" or
"falling"), so one noisy step never fires a rule.

The same history drives the stage's stop rules (`trainer.until`, `config.schema.StopRules`): the first to fire ends
the stage after that step (`StageEnd`). A resumed stage replays its metrics.jsonl, so it decides at the same step.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

from or1.config.schema import HealthConfig, RunConfig, StopRules
from or1.run_metrics import (
    ENTROPY,
    MISMATCH_K3_KL,
    REJECTED_FRAC,
    SLOWEST_ROW_SECONDS,
    STALENESS_MAX,
    STEP,
    TOKENS_PER_S,
    TRUNCATED_FRAC,
    VALIDATION_ACCURACY,
    VALIDATION_PREFIX,
    is_training_step,
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


@dataclass(frozen=True)
class StageEnd:
    """The stop rule that ended the stage: at which step, on which metric and value, and what it measured."""

    rule: str
    step: int
    metric: str
    value: float
    detail: str

    def line(self) -> str:
        return f"until.{self.rule}: step {self.step}: {self.metric} = {self.value:.4g} ({self.detail})"

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def set_metric(set_name: str | None) -> str:
    """What a validation stop rule reads, as a metric name."""
    return f"{VALIDATION_PREFIX}{set_name}" if set_name else f"{VALIDATION_PREFIX}mean"


def truncated_stop(h: History, v: Validations, u: StopRules) -> tuple[str, float, str] | None:
    """The share's mean over the window reached at_least, climbing from under it: a stage that starts truncated (an
    8K stage starts near 40%) first has to come down."""
    rule = u.truncated
    share = h.latest(TRUNCATED_FRAC, rule.window) if rule is not None else None
    if share is None or share < rule.at_least or not h.was_under(TRUNCATED_FRAC, rule.window, rule.at_least):
        return None
    return TRUNCATED_FRAC, share, f"mean of the last {rule.window} steps, up from under {rule.at_least:g}"


def plateau_stop(h: History, v: Validations, u: StopRules) -> tuple[str, float, str] | None:
    rule = u.plateau
    if rule is None:
        return None
    scores = v.set_scores(rule.set)
    best = plateau(scores, rule.evaluations, rule.min_gain)
    if best is None:
        return None
    before = max(scores[: -rule.evaluations])
    detail = (
        f"{rule.evaluations} evaluations without beating the earlier best {before:.4g} by {rule.min_gain:g}"
    )
    return set_metric(rule.set), best, detail


def target_stop(h: History, v: Validations, u: StopRules) -> tuple[str, float, str] | None:
    rule = u.target
    if rule is None:
        return None
    scores = v.set_scores(rule.set)
    if len(scores) < 2:  # the stage's start is not a score it reached
        return None
    goal = rule.score if rule.score is not None else scores[0] + rule.gain
    if scores[-1] < goal:
        return None
    if rule.score is not None:
        return set_metric(rule.set), scores[-1], f"reached the target {rule.score:g}"
    return set_metric(rule.set), scores[-1], f"{scores[-1] - scores[0]:+.4g} over the start's {scores[0]:.4g}"


def idle_stop_rules(cfg: RunConfig) -> str | None:
    """Why the stage's validation stop rules cannot fire (no validation, or none before the last step), else None: a
    run with validation turned off still runs, to its trainer.steps."""
    until, validation = cfg.trainer.until, cfg.data.validation
    rules = [name for name in ("plateau", "target") if getattr(until, name) is not None]
    if not rules or (validation.sets and validation.every):
        return None
    why = "no validation before the last step" if validation.sets else "no validation set"
    return (
        f"trainer.until.{' and .'.join(rules)} read validation, and this stage has {why} "
        "(data.validation.sets, .every): it runs its trainer.steps"
    )


# A stop rule: (step history, evaluations, the stage's rules) -> (metric, value, what it measured) when it fires
StopRule = Callable[[History, Validations, StopRules], tuple[str, float, str] | None]
STEP_STOPS: dict[str, StopRule] = {"truncated": truncated_stop}
VALIDATION_STOPS: dict[str, StopRule] = {"plateau": plateau_stop, "target": target_stop}


class Advisor:
    """Feeds a stage's records to the health rules and the stop rules in order: each health rule (and each
    validation metric) fires once; the first stop rule to fire sets `ended`.

    A step is observed in two parts, its step metrics and then its validation (`observe_step`,
    `observe_validation`), because a stop rule that fires on the step metrics asks for a validation of that step, the
    stage's last; a replay of the logged records observes the same two parts in the same order."""

    def __init__(self, config: HealthConfig, until: StopRules | None = None):
        self.config = config
        self.until = until or StopRules()
        self.history = History()
        self.validations = Validations()
        self.fired: list[Advisory] = []
        self.ended: StageEnd | None = None

    def observe(self, record: Mapping[str, object]) -> list[Advisory]:
        """What a logged record (a step's, or step 0's validation) fires."""
        step = int(record[STEP])  # type: ignore[call-overload]
        fired = self.observe_step(step, record) if is_training_step(record) else []
        return fired + self.observe_validation(step, record)

    def observe_step(self, step: int, metrics: Mapping[str, object]) -> list[Advisory]:
        """The advisories a trained step's metrics fire (none when health checks are off); a stop rule on them may
        end the stage."""
        self.history.add(metrics)
        self._stop(step, STEP_STOPS)
        if not self.config.enabled:
            return []
        done = {a.rule for a in self.fired}
        new = [
            Advisory(name, step, *hit)
            for name, rule in RULES.items()
            if name not in done and (hit := rule(self.history, self.config)) is not None
        ]
        self.fired.extend(new)
        return new

    def observe_validation(self, step: int, record: Mapping[str, object]) -> list[Advisory]:
        """The advisories the evaluation in `record` fires (none without one); a stop rule on it may end the stage."""
        keys = self.validations.add(record)
        if keys:
            self._stop(step, VALIDATION_STOPS)
        if not self.config.enabled:
            return []
        new = []
        done = {a.rule for a in self.fired}
        c = self.config
        for key in keys:
            rule = f"validation:{key}"
            if rule in done:
                continue
            best = plateau(self.validations.series(key), c.validation_patience, c.validation_min_gain)
            if best is not None:
                advice = (
                    f"no gain over the last {c.validation_patience} evaluations (best {best:.1%}): "
                    "the stage may be done (go on to the next), or try a lower learning rate or harder data"
                )
                new.append(Advisory(rule, step, key, best, advice))
        self.fired.extend(new)
        return new

    def _stop(self, step: int, rules: dict[str, StopRule]) -> None:
        if self.ended is not None:
            return
        for name, rule in rules.items():
            if (hit := rule(self.history, self.validations, self.until)) is not None:
                self.ended = StageEnd(name, step, *hit)
                return

    @classmethod
    def replaying(
        cls, records: Iterable[Mapping[str, object]], config: HealthConfig, until: StopRules | None = None
    ) -> Advisor:
        """An advisor that has seen `records` (a stage's metrics.jsonl so far): the summary reads its `fired` and
        `ended`, a resumed trainer goes on from it without firing again what already fired."""
        advisor = cls(config, until)
        for record in records:
            advisor.observe(record)
        return advisor
