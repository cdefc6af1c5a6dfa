"""The stage's stop rules (`trainer.until`, `config.schema.StopRules`): the first to fire ends the stage after that
step (`StageEnd`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from or1.config.schema import RunConfig, StopRules
from or1.health.history import History, Validations, plateau
from or1.run_metrics import TRUNCATED_FRAC, VALIDATION_PREFIX


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
