"""The rollout's sampling seeds: a run's samples are fixed by its seed, and must not drift across refactors.

The pinned values were computed with the formulas or1 used before the SamplingRequest (the prompt loader's
`seed + 1_000_003 * round`, validation's `seed + 7919` without a step, and the worker's
`(seed * 1_000_003 + step * 7919 + tp_group * 104_729) % (2**31 - 1)`): a change here changes every run's samples.
"""

from __future__ import annotations

import pytest

from or1.config.recipe import resolve
from or1.hybrid.sampling import SamplingRequest, sampling_seed


@pytest.mark.parametrize(
    ("seed", "step", "refill_round", "tp_group", "pinned"),
    [
        (0, 1, 0, 0, 7919),
        (0, 1, 0, 1, 112_648),
        (42, 7, 0, 0, 42_055_559),
        (42, 7, 2, 1, 746_884_949),
        (123_456_789, 1000, 1, 3, 1_906_325_325),  # past 2**31 - 1: the modulus
    ],
)
def test_training_seeds_are_the_ones_runs_always_sampled_with(seed, step, refill_round, tp_group, pinned):
    assert sampling_seed(seed, step, refill_round, tp_group) == pinned


@pytest.mark.parametrize(
    ("seed", "tp_group", "pinned"), [(0, 0, 1_476_572_816), (42, 0, 1_518_572_942), (42, 3, 1_518_887_129)]
)
def test_validation_seeds_are_the_ones_runs_always_sampled_with(seed, tp_group, pinned):
    assert sampling_seed(seed, None, 0, tp_group) == pinned


def test_a_training_request_carries_the_recipes_rollout_settings_and_seed():
    cfg = resolve("tiny", 1, ["model.path=unused", "trainer.seed=42", "rollout.n=3", "rollout.top_p=0.9"])
    request = SamplingRequest.training(cfg, 7, refill_round=2)
    r = cfg.rollout
    assert (request.n, request.temperature, request.top_p, request.max_response_length) == (
        3,
        r.temperature,
        0.9,
        r.max_response_length,
    )
    assert (request.seed, request.step, request.refill_round) == (42, 7, 2)
    assert request.engine_seed(1) == 746_884_949
