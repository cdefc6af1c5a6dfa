"""The health rules: each reads the step history and the `trainer.health` thresholds and fires with one line that
names the metric, its value and what to try."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from or1.config.schema import HealthConfig
from or1.health.history import History
from or1.run_metrics import (
    ENTROPY,
    MISMATCH_K3_KL,
    REJECTED_FRAC,
    SLOWEST_ROW_SECONDS,
    STALENESS_MAX,
    TOKENS_PER_S,
    TRUNCATED_FRAC,
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
