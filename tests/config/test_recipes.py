"""The shipped recipes say exactly what ../shared/docs/RECIPE.md says."""

import pytest

from or1.config.loading import RECIPES_DIR, load_recipe, resolve, stage_names

K = 1024

# (recipe, stage): (global step range, context, batch, mini-batch, group) from RECIPE.md "Stages (as released)".
RELEASED = {
    ("or1-math-7b", 1): ((0, 740), 8 * K, 256, 128, 16),
    ("or1-math-7b", 2): ((740, 1740), 16 * K, 256, 128, 16),
    ("or1-math-7b", 3): ((1740, 2080), 32 * K, 256, 128, 16),
    ("or1-math-7b", 4): ((2080, 2160), 32 * K, 128, 64, 64),
    ("or1-7b", 1): ((0, 660), 16 * K, 256, 256, 16),
    ("or1-7b", 2): ((660, 1320), 32 * K, 160, 160, 32),
    ("or1-32b", 1): ((0, 760), 16 * K, 256, 256, 16),
    ("or1-32b", 2): ((760, 1130), 24 * K, 160, 160, 32),
}


@pytest.mark.parametrize(("recipe", "stage"), sorted(RELEASED))
def test_released_stage_tables(recipe, stage):
    (start, end), context, batch, mini, group = RELEASED[(recipe, stage)]
    config = resolve(recipe, stage)
    assert (config.stage.start_step, config.stage.start_step + config.trainer.steps) == (start, end)
    assert config.rollout.max_response_length == context
    assert (config.trainer.batch_size, config.actor.ppo_mini_batch_size, config.rollout.n) == (
        batch,
        mini,
        group,
    )


def test_math_7b_stage_names_follow_the_paper():
    assert stage_names(load_recipe("or1-math-7b")[1]) == ["1", "2", "3", "3.5"]


@pytest.mark.parametrize(("size", "tp"), [("7b", 1), ("32b", 2)])
def test_preview_recipes(size, tp):
    contexts = [resolve(f"or1-{size}-preview", s).rollout.max_response_length for s in (1, 2, 3)]
    assert contexts == [8 * K, 16 * K, 32 * K]
    for stage in (1, 2, 3):
        config = resolve(f"or1-{size}-preview", stage)
        assert (config.data.max_prompt_length, config.trainer.batch_size, config.rollout.n) == (2048, 256, 16)
        assert config.rollout.tensor_parallel_size == tp and config.actor.offload
        assert (config.trainer.save_every, config.data.validation.every, config.trainer.devices_per_node) == (
            20,
            20,
            8,
        )
        # The repository's entropy knobs are what the preview scripts used.
        entropy = config.algorithm.entropy
        assert (entropy.target, entropy.delta, entropy.max_coef, entropy.min_coef) == (
            0.2,
            0.0001,
            0.005,
            0.0,
        )
        assert config.trainer.steps is None  # the scripts switched stages case by case
        assert entropy.timing == "repository"
    assert resolve(f"or1-{size}-preview", 3).actor.sequence_parallel_size == (2 if size == "32b" else 1)


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("or1-*.yaml")))
def test_real_recipes_use_the_paper_algorithm(recipe):
    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        config = resolve(recipe, stage)
        algo, actor, rollout = config.algorithm, config.actor, config.rollout
        assert algo.advantage == "grpo" and algo.norm_adv_by_std and algo.rejection_sampling
        assert not algo.kl.enabled and algo.truncated == "zero_reward" and algo.online_filter
        assert (actor.lr, actor.grad_clip, actor.ppo_epochs, actor.loss_agg_mode) == (
            1e-6,
            1.0,
            1,
            "token-mean",
        )
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2)
        assert (rollout.temperature, rollout.top_p) == (1.0, 1.0)
        assert (
            algo.entropy.mode == "adaptive" and algo.entropy.target == 0.2 and algo.entropy.init_coef == 0.0
        )
        if "preview" not in recipe:
            assert (algo.entropy.delta, algo.entropy.max_coef) == (0.005, None)  # the paper's values
        validation = config.data.validation
        assert (
            validation.sets == ["aime24", "aime25"]
            and validation.n == 8
            and validation.temperatures == [0.6, 1.0]
        )
