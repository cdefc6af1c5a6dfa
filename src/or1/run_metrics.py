"""The run's metrics as a contract: the metrics.jsonl keys read outside the code that writes them, and their reader.

The trainer writes one record per step to stage<N>/metrics.jsonl. Run health (`or1.health`), the stage summary,
`or1 report` and the planner's expected lengths read it back; they and the writers name every key they share
through the constants below, each declared with its unit and meaning (`docs/metrics.md` is `metrics_table()`), so a
renamed key is one edit and a reader cannot silently lose its metric (`tests/test_run_metrics.py` checks that the
readers spell no key of their own). Families with a varying part (a phase, an ability, a validation set) are
functions. `read_metrics` is the one reader of the file: a line that is not a JSON object with a step (the last
one, while a step is being written) is skipped.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Metric:
    name: str  # the key, or a family's pattern with <placeholders>
    unit: str
    meaning: str


METRICS: dict[str, Metric] = {}


def _declare(name: str, unit: str, meaning: str) -> str:
    METRICS[name] = Metric(name, unit, meaning)
    return name


STEP = _declare("step", "steps", "the stage's step; 0 is the validation before the first update")
SKIPPED = _declare("skipped", "flag", "1 on a step that trained nothing (no group with reward variance)")
REWARD_MEAN = _declare(
    "reward/mean", "0-1", "mean reward of the step's sampled responses (truncated ones score 0)"
)
SOLVE_ALL_FRAC = _declare("reward/solve_all_frac", "fraction", "groups whose every response was correct")
SOLVE_NONE_FRAC = _declare("reward/solve_none_frac", "fraction", "groups with no correct response")
SAMPLED = _declare("batch/sampled", "responses", "responses sampled (a training step's record always has it)")
REJECTED_FRAC = _declare(
    "batch/rejected_frac", "fraction", "groups dropped by rejection sampling (one reward: no advantage)"
)
LENGTH_MEAN = _declare("response/length_mean", "tokens", "mean sampled response length")
LENGTH_MAX = _declare("response/length_max", "tokens", "longest sampled response")
TRUNCATED_FRAC = _declare(
    "response/truncated_frac", "fraction", "responses cut at the stage's budget (score 0)"
)
RESPONSE_TOKENS = _declare("response/tokens", "tokens", "response tokens sampled in the step")
ENTROPY = _declare(
    "actor/entropy", "nats / token", "full-vocabulary entropy of the policy on the trained responses"
)
SAMPLED_ENTROPY = _declare(
    "entropy/entropy",
    "nats / token",
    "entropy estimate of adaptive control: -mean log-prob of sampled tokens",
)
ENTROPY_TARGET = _declare("entropy/target", "nats / token", "adaptive entropy control's target")
ENTROPY_COEF = _declare(
    "entropy/coef", "coefficient", "adaptive entropy control's coefficient after the step"
)
MISMATCH_ABS_DIFF_MEAN = _declare(
    "mismatch/abs_diff_mean", "nats / token", "mean |log pi_actor - log pi_sampler| over the trained tokens"
)
MISMATCH_ABS_DIFF_MAX = _declare(
    "mismatch/abs_diff_max", "nats / token", "largest |log pi_actor - log pi_sampler| of a trained token"
)
MISMATCH_K3_KL = _declare("mismatch/k3_kl", "nats / token", "k3 estimate of KL(sampler || actor)")
STALENESS_MAX = _declare(
    "async/staleness_max",
    "steps",
    "separate placement: the trained batch's largest staleness (policy versions)",
)
TOKEN_STALENESS_MEAN = _declare(
    "async/token_staleness_mean",
    "steps",
    "partial rollout: mean staleness of the trained response tokens, each by the version that sampled it",
)
TOKEN_STALENESS_MAX = _declare(
    "async/token_staleness_max", "steps", "partial rollout: the largest staleness of a trained response token"
)
VERSIONS_PER_GROUP_MAX = _declare(
    "async/versions_per_group_max",
    "versions",
    "partial rollout: the most policy versions whose tokens one GRPO group mixes",
)
VALUE_LOSS = _declare("critic/vf_loss", "squared error", "the critic's value loss (GAE)")
STEP_SECONDS = _declare("time/step", "seconds", "wall time of the whole step")
SLOWEST_ROW_SECONDS = _declare("time/reward_slowest_row", "seconds", "the step's slowest-scored response")
TOKENS_PER_S = _declare("perf/tokens_per_s", "tokens / s", "the step's response tokens over time/step")
GENERATE_TOKENS_PER_S = _declare(
    "perf/generate_tokens_per_s", "tokens / s", "response tokens of all sampling rounds over time/generate"
)
UPDATE_TOKENS_PER_S = _declare(
    "perf/update_tokens_per_s", "tokens / s", "prompt + response tokens through the update, times its epochs"
)
UPDATE_TFLOPS_PER_DEVICE = _declare(
    "perf/update_tflops_per_device", "TFLOP/s", "the update's model FLOPs per second per training device"
)
UPDATE_MFU = _declare("perf/update_mfu", "0-1", "perf/update_tflops_per_device over the device's peak")
STEP_MFU = _declare(
    "perf/step_mfu",
    "0-1",
    "the step's model FLOPs (generation's forward over every sampled sequence, the update's) over time/step, every "
    "device the step used and their peak",
)
PEAK_TFLOPS_PER_DEVICE = _declare(
    "perf/peak_tflops_per_device", "TFLOP/s", "the peak perf/update_mfu divides by"
)
_declare("time/<phase>", "seconds", "a phase of the step: generate, reward, old_log_prob, update, ...")
_declare("perf/share_<phase>", "fraction", "a phase's share of time/step: generate, reward, update, other")
_declare(
    "perf/<rate>_per_device",
    "tokens / s",
    "a perf/ rate over its devices: generate over the rollout devices, update over the training devices, "
    "tokens_per_s over every device the step used",
)
_declare("<ability>/reward_mean", "0-1", "reward/mean of one ability's responses (math, code), when mixed")
_declare(
    "val/<set>/t<T>/avg@<n>", "0-1", "validation accuracy on a set at temperature T, n samples per problem"
)
_declare("val/<set>/t<T>/truncated_frac", "fraction", "validation samples cut at the validation budget")

VALIDATION_PREFIX = "val/"
VALIDATION_ACCURACY = re.compile(r"^val/(?P<set>.+)/t(?P<temperature>[^/]+)/avg@(?P<n>\d+)$")


def phase_seconds(phase: str) -> str:
    return f"time/{phase}"


def phase_share(phase: str) -> str:
    return f"perf/share_{phase}"


def per_device(rate: str) -> str:
    return f"{rate}_per_device"


def devices_text(facts: dict[str, Any]) -> str:
    """`2 devices` (colocated: the same devices sample and train), `1 training + 2 rollout devices` (separate), from
    summary.json's `device_peak` (`or1.trainer.throughput.Throughput.facts`; a run from before the rollout count has only `devices`)."""
    trained = facts["devices"]
    step = facts.get("step_devices", trained)
    if step == trained:
        return f"{trained} device{'s' if trained > 1 else ''}"
    return f"{trained} training + {step - trained} rollout devices"


def ability_reward_mean(ability: str) -> str:
    return f"{ability}/reward_mean"


def validation_accuracy(set_name: str, temperature: float, n: int) -> str:
    return f"val/{set_name}/t{temperature:g}/avg@{n}"


def validation_truncated(accuracy_key: str) -> str:
    """The truncation key beside a validation accuracy key."""
    return accuracy_key.rsplit("/", 1)[0] + "/truncated_frac"


def is_validation_accuracy(key: str) -> bool:
    return VALIDATION_ACCURACY.match(key) is not None


def is_training_step(record: dict[str, Any]) -> bool:
    """A step that sampled (a validation-only record, step 0, has no SAMPLED)."""
    return SAMPLED in record


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's records in order; none when the file is missing. A line that is not a JSON object with a
    step (the one being written right now) is skipped."""
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and STEP in record:
            records.append(record)
    return records


def metrics_table() -> str:
    """The declared metrics as a markdown table (docs/metrics.md)."""
    rows = ["| key | unit | meaning |", "|---|---|---|"]
    rows += [f"| `{m.name}` | {m.unit} | {m.meaning} |" for m in METRICS.values()]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":  # python -m or1.run_metrics > the table in docs/metrics.md
    sys.stdout.write(metrics_table())
