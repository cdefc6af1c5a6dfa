"""Recipes resolve strictly: every user mistake is one line naming the file and key, exit code 2."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

from or1.cli import app
from or1.config.recipe import resolve
from or1.errors import UserError


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return str(path)


BASE = """
name: t
model: {path: some/model}
data: {train_files: [a.parquet]}
trainer: {batch_size: 4, devices_per_node: 2}
actor: {ppo_mini_batch_size: 4}
stages:
  - {name: short, steps: 3, rollout: {max_response_length: 32}}
  - {name: long, steps: 5, rollout: {max_response_length: 64, n: 4}}
"""


def test_stage_overrides_merge_over_shared_settings(tmp_path):
    recipe = write(tmp_path, BASE)
    first, second = resolve(recipe, 1), resolve(recipe, "long")
    assert (first.rollout.max_response_length, first.rollout.n, first.trainer.steps) == (32, 16, 3)
    assert (second.rollout.max_response_length, second.rollout.n, second.trainer.steps) == (64, 4, 5)
    assert second.stage.index == 2 and second.stage.start_step == 3
    assert second.trainer.batch_size == 4  # shared setting survives the stage override


def test_set_overrides_parse_yaml_values(tmp_path):
    config = resolve(
        write(tmp_path, BASE),
        2,
        ["rollout.temperature=0.6", "algorithm.entropy.max_coef=0.005", "critic.lr=5e-5"],
    )
    assert config.rollout.temperature == 0.6
    assert config.algorithm.entropy.max_coef == 0.005
    assert config.critic.lr == 5e-5  # every section of RunConfig can be set, the critic's too


@pytest.mark.parametrize(
    ("text", "stage", "overrides", "expected"),
    [
        (BASE.replace("n: 4", "nn: 4"), 2, [], "stages[1].rollout.nn: unknown key"),
        (BASE.replace("batch_size: 4,", "batch_size: four,"), 1, [], "recipe.yaml: trainer.batch_size: "),
        (BASE, 1, ["actor.lr=fast"], "--set actor.lr: "),
        (BASE, 1, ["actor.learning_rate=1"], "--set actor.learning_rate: unknown key"),
        (BASE, 1, ["rollout.n=1"], "recipe.yaml with --set rollout.n: rollout.n is 1: a group of one"),
        (BASE, 1, ["actor.ppo_mini_batch_size=8"], "mini_batch_size (8) exceeds trainer.batch_size (4)"),
        (
            BASE,
            1,
            ["critic.sequence_parallel_size=4"],
            "critic.sequence_parallel_size (4) must divide the world",
        ),
        (
            BASE,
            1,
            ["actor.policy_loss=gspo"],
            "actor.policy_loss gspo is defined with a mean over responses of each response's token mean: add "
            "actor.loss_agg_mode: seq-mean-token-mean (got token-mean)",
        ),
        (
            BASE.replace(
                "actor: {ppo_mini_batch_size: 4}", "actor: {ppo_mini_batch_size: 4, policy_loss: gspo}"
            ),
            1,
            ["actor.loss_agg_mode=seq-mean-token-sum"],
            "add actor.loss_agg_mode: seq-mean-token-mean (got seq-mean-token-sum)",
        ),
        (BASE, 1, ["critc.lr=1"], "the key must start with one of model, data, rollout, actor, critic,"),
        (BASE, 3, [], "stage 3 is out of range"),
        (BASE.replace("model: {path: some/model}", "modle: {path: x}"), 1, [], "modle: unknown key"),
        (BASE.replace("model: {path: some/model}", "model: {}"), 1, [], "model.path: missing required key"),
    ],
)
def test_mistakes_name_the_file_and_key(tmp_path, text, stage, overrides, expected):
    with pytest.raises(UserError, match=None) as caught:
        resolve(write(tmp_path, text), stage, overrides)
    assert expected in str(caught.value)
    assert "\n" not in str(caught.value)


def test_gspo_resolves_with_its_sequence_mean(tmp_path):
    overrides = ["actor.policy_loss=gspo", "actor.loss_agg_mode=seq-mean-token-mean"]
    actor = resolve(write(tmp_path, BASE), 1, overrides).actor
    assert (actor.policy_loss, actor.loss_agg_mode) == ("gspo", "seq-mean-token-mean")


def test_missing_recipe_is_a_user_error():
    with pytest.raises(UserError, match="recipe not found: no-such-recipe"):
        resolve("no-such-recipe", 1)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--recipe", "no-such-recipe"], "recipe not found"),
        (["--recipe", "or1-7b", "--stage", "9"], "out of range"),
        (["--recipe", "or1-7b", "--set", "rollout.tempreature=1"], "unknown key"),
        (["--recipe", "or1-7b", "--set", "rollout.temperature=hot"], "rollout.temperature"),
    ],
)
def test_cli_prints_one_line_and_exits_2(args, expected):
    result = CliRunner().invoke(app, ["config", "show", *args])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output
    assert (
        len([line for line in result.output.splitlines() if line.strip()]) <= 2
    )  # rich may wrap the one line


def test_config_show_prints_the_resolved_stage():
    result = CliRunner().invoke(app, ["config", "show", "--recipe", "or1-math-7b", "--stage", "3.5"])
    assert result.exit_code == 0
    assert "max_response_length: 32768" in result.output and "n: 64" in result.output
