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

history.py     what the rules read: the step metrics so far and the evaluations
advisories.py  the health rules (`trainer.health`) and `Advisory`
stop_rules.py  the stop rules (`trainer.until`) and `StageEnd`
advisor.py     `Advisor`: the records in order through both
"""

from or1.health.advisor import Advisor
from or1.health.stop_rules import idle_stop_rules

__all__ = ["Advisor", "idle_stop_rules"]
