"""Validation during training: when it runs, what it loads, and how the step line shows it."""

from pathlib import Path

import pandas as pd
import torch

from or1.config.recipe import resolve
from or1.hybrid.batch import Batch
from or1.hybrid.columns import ABILITY, RESPONSE_MASK, RESPONSE_TEXT, REWARD_MODEL, SCORES, TRUNCATED
from or1.trainer.step_log import progress_line
from or1.trainer.validation import ValidationSet, is_due, load_validation_sets, validate

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


def test_validation_runs_every_n_steps_and_at_the_end():
    cfg = resolve(RECIPE, 1, ["trainer.steps=10", "data.validation.every=4"])
    assert [s for s in range(1, 11) if is_due(cfg, s)] == [4, 8, 10]
    only_end = resolve(RECIPE, 1, ["trainer.steps=10", "data.validation.every=0"])
    assert [s for s in range(1, 11) if is_due(only_end, s)] == [10]


def test_validation_sets_are_encoded_and_capped(tmp_path, tiny_model_dir):
    rows = [
        {
            "data_source": "v",
            "prompt": [{"role": "user", "content": "Compute " + "1+" * k + "1."}],
            "ability": "math",
            "reward_model": {"ground_truth": f'["{k + 1}"]', "style": "rule"},
            "extra_info": {"index": k},
        }
        for k in (1, 2, 40)  # the last prompt is longer than max_prompt_length
    ]
    path = tmp_path / "val.parquet"
    pd.DataFrame(rows).to_parquet(path)
    cfg = resolve(
        RECIPE, 1, [f"data.validation.sets=[{path}]", "data.max_prompt_length=32", "trainer.until={}"]
    )
    from or1.tokens import load_tokenizer

    (vset,) = load_validation_sets(cfg, load_tokenizer(tiny_model_dir))
    assert vset.name == "val" and len(vset.prompts) == 2 and vset.too_long == 1
    assert list(vset.prompts["ability"]) == ["math", "math"]


def test_progress_line_shows_validation():
    assert progress_line(0, 5, {"val/v/t1/avg@5": 0.25}) == "step 0/5 validation: v/t1/avg@5 25.0%"
    line = progress_line(1, 5, {"skipped": 1.0, "reward/mean": 1.0, "batch/sampled": 8})
    assert line.startswith("step 1/5 skipped")


def test_validation_budget_defaults_to_the_largest_stage_budget():
    # tiny's stages sample at 48 / 64 / 96 tokens: every stage validates at 96, the full length.
    assert [resolve(RECIPE, s).data.validation.max_response_length for s in (1, 2, 3)] == [96, 96, 96]
    assert [resolve(RECIPE, s).rollout.max_response_length for s in (1, 2, 3)] == [48, 64, 96]
    # A --set of the rollout budget applies to every stage, so it is the largest; an explicit budget wins.
    assert resolve(RECIPE, 1, ["rollout.max_response_length=40"]).data.validation.max_response_length == 40
    explicit = ["data.validation.max_response_length=70"]
    assert resolve(RECIPE, 3, explicit).data.validation.max_response_length == 70


def test_a_validation_set_can_sample_its_own_k_and_budget(tmp_path, tiny_model_dir):
    from or1.data.synthetic import code_validation_rows, math_validation_rows
    from or1.tokens import load_tokenizer

    math, code = tmp_path / "math.parquet", tmp_path / "code.parquet"
    pd.DataFrame(math_validation_rows()[:3]).to_parquet(math)
    pd.DataFrame(code_validation_rows()[:2]).to_parquet(code)
    sets = f"data.validation.sets=[{math}, {{set: {code}, n: 3, max_response_length: 80}}]"
    cfg = resolve(RECIPE, 1, [sets, "data.validation.n=5", "data.max_prompt_length=64", "trainer.until={}"])
    first, second = load_validation_sets(cfg, load_tokenizer(tiny_model_dir))
    assert (first.name, first.n, first.max_response_length) == ("math", 5, 96)
    assert (second.name, second.n, second.max_response_length) == ("code", 3, 80)
    assert list(second.prompts["ability"]) == ["code", "code"]


def test_validation_asks_each_set_at_its_own_n_and_budget_with_the_same_seeds_every_time():
    """What validate asks the rollout workers: each set's n and budget (the recipe's rollout budget when it has
    none), every temperature at validation's top_p, and no step, so every validation samples with the same seeds."""
    settings = ["model.path=unused", "trainer.seed=42", "data.validation.temperatures=[0.6,1.0]"]
    cfg = resolve(RECIPE, 1, [*settings, "data.validation.top_p=0.95", "rollout.max_response_length=40"])
    prompts = Batch.from_dict({"prompt_ids": [[1], [2]], ABILITY: ["math"] * 2, REWARD_MODEL: [{}, {}]})
    sets = [ValidationSet("a", prompts, 0, 3, None), ValidationSet("b", prompts, 0, 2, 80)]
    asked = []

    class Actor:
        def generate_sequences(self, prompts, request):
            asked.append(request)
            rows = len(prompts) * request.n
            tensors = {TRUNCATED: torch.zeros(rows, dtype=torch.bool), RESPONSE_MASK: torch.ones(rows, 4)}
            return Batch(
                tensors, {ABILITY: ["math"] * rows, RESPONSE_TEXT: [""] * rows, REWARD_MODEL: [{}] * rows}
            )

    class Rewards:
        def compute_scores(self, batch):
            return Batch({SCORES: torch.ones(len(batch))})

    metrics = validate(sets, Actor(), Rewards(), cfg)
    assert metrics["val/b/t0.6/avg@2"] == 1.0 and metrics["val/a/t1/length_mean"] == 4.0
    seen = [(r.n, r.temperature, r.top_p, r.max_response_length, r.step) for r in asked]
    assert seen == [
        (3, 0.6, 0.95, 40, None),
        (3, 1.0, 0.95, 40, None),
        (2, 0.6, 0.95, 80, None),
        (2, 1.0, 0.95, 80, None),
    ]
    # validation's seed, pinned from the formula before SamplingRequest: trainer.seed + 7919, step 0
    assert {r.engine_seed(0) for r in asked} == {1_518_572_942}
