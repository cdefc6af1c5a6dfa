import pytest

from or1.tinyworld.init import _tokenizer_corpus
from or1.tinyworld.tokenizer import IM_END, train_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_tokenizer_corpus(seed=0, size=2000))


def test_vocabulary_is_small(tokenizer):
    assert 300 <= len(tokenizer) <= 400  # 379 on the default corpus: BPE runs out of merges below the cap


def test_digits_are_single_tokens(tokenizer):
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("12-345=-333.", add_special_tokens=False)["input_ids"])
    digit_tokens = [t for t in tokens if any(c.isdigit() for c in t)]
    assert all(sum(c.isdigit() for c in t) == 1 for t in digit_tokens)
    assert len(digit_tokens) == 8


def test_chat_template_and_eos(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Compute 1+2."}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nCompute 1+2.<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token_id != tokenizer.eos_token_id
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tokenizer.eos_token_id) == 1  # special tokens are atomic, never split into bytes


def test_any_text_round_trips(tokenizer):
    text = "def f(x):\n    return x * 2  # ünïcode ✓\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
