"""PromptLoader: chat-templated ids, long prompts dropped, seeded per-epoch order, exact resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from or1.data.rows import write_rows
from or1.data.synthetic import math_train_rows
from or1.errors import UserError
from or1.tinyworld.tokenizer import train_tokenizer
from or1.tokens import prompt_ids
from or1.trainer.prompt_loader import PromptLoader


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([f"Compute {a}+{b}-3. {a}+{b}={a + b}." for a in range(10) for b in range(10)])


@pytest.fixture(scope="module")
def train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_rows(tmp_path_factory.mktemp("rows") / "train.parquet", math_train_rows(seed=1, size=10))


def keys(batch) -> list[str]:
    return list(batch.non_tensor["prompt_key"])


def test_batches_are_templated_and_resume_exactly(tokenizer, train_file: Path) -> None:
    loader = PromptLoader([train_file], tokenizer, batch_size=4, max_prompt_length=64, seed=3)
    first = loader.next_batch(1)
    text = tokenizer.decode(first.non_tensor["prompt_ids"][0])
    assert text.startswith("<|im_start|>user\nCompute ") and text.endswith("<|im_start|>assistant\n")
    assert list(first.non_tensor["uid"]) == ["1-0", "1-1", "1-2", "1-3"]
    state = loader.state_dict()
    rest = [keys(loader.next_batch(s)) for s in (2, 3, 4)]  # 10 prompts: batch 3 starts epoch 1
    resumed = PromptLoader([train_file], tokenizer, batch_size=4, max_prompt_length=64, seed=3)
    resumed.load_state_dict(state)
    assert [keys(resumed.next_batch(s)) for s in (2, 3, 4)] == rest
    epoch0 = keys(first) + rest[0]
    assert len(set(epoch0)) == 8 and rest[1] != epoch0[:4]  # no repeats within an epoch; a new order after


def test_long_prompts_are_dropped_and_too_few_is_a_user_error(tokenizer, train_file: Path) -> None:
    lengths = sorted(len(prompt_ids(tokenizer, r["prompt"])) for r in math_train_rows(seed=1, size=10))
    limit = lengths[5]
    loader = PromptLoader([train_file], tokenizer, batch_size=2, max_prompt_length=limit, seed=0)
    assert loader.too_long == sum(n > limit for n in lengths) and len(loader) == 10 - loader.too_long
    with pytest.raises(UserError, match="max_prompt_length"):
        PromptLoader([train_file], tokenizer, batch_size=10, max_prompt_length=limit, seed=0)
