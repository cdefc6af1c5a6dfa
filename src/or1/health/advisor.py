"""`Advisor`: a stage's records, in order, through the health rules and the stop rules."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from or1.config.schema import HealthConfig, StopRules
from or1.health.advisories import RULES, Advisory
from or1.health.history import History, Validations, plateau
from or1.health.stop_rules import STEP_STOPS, VALIDATION_STOPS, StageEnd, StopRule
from or1.run_metrics import STEP, is_training_step


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
