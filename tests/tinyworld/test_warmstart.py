import pytest
import torch

from or1.data.synthetic_code import OPS, CodeTask
from or1.data.synthetic_math import ArithmeticProblem
from or1.tinyworld.architecture import build_tiny_model, count_parameters
from or1.tinyworld.init import _tokenizer_corpus
from or1.tinyworld.tokenizer import train_tokenizer
from or1.tinyworld.warmstart import IGNORE_INDEX, SFTConfig, lr_factor, sft_batch, sft_examples


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(_tokenizer_corpus(seed=0, size=2000))


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = SFTConfig(steps=200, warmup_steps=30)
    factors = [lr_factor(step, cfg) for step in range(cfg.steps)]
    assert factors[0] == pytest.approx(1 / 30)
    assert factors[29] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[29:], factors[30:], strict=False))
    assert factors[-1] == pytest.approx(0.1)


def test_sft_batch_trains_on_the_response_only(tokenizer):
    program = CodeTask((("add", 3), ("square", 0)), (), ())
    examples = [
        (p.prompt, p.solution)
        for p in (ArithmeticProblem((3, 4), ("+",)), ArithmeticProblem((1, 2, 3), ("-", "+")))
    ] + [(program.prompt, program.response)]
    batch = sft_batch(tokenizer, examples)
    for i, (prompt, response) in enumerate(examples):
        kept = batch["labels"][i][batch["labels"][i] != IGNORE_INDEX].tolist()
        assert tokenizer.decode(kept) == response + tokenizer.eos_token
        ids = batch["input_ids"][i][batch["attention_mask"][i].bool()].tolist()
        assert tokenizer.decode(ids).startswith("<|im_start|>user\n" + prompt)
    assert (batch["labels"][batch["attention_mask"] == 0] == IGNORE_INDEX).all()


def test_tiny_model_size(tokenizer):
    model = build_tiny_model(tokenizer, seed=0)
    assert 1.6e6 < count_parameters(model) < 1.8e6
    assert model.config.tie_word_embeddings and model.config.eos_token_id == tokenizer.eos_token_id
    again = build_tiny_model(tokenizer, seed=0)
    assert torch.equal(model.model.embed_tokens.weight, again.model.embed_tokens.weight)


def test_sft_batches_mix_programs_into_arithmetic_at_the_configured_share():
    batches = sft_examples(seed=0, cfg=SFTConfig(batch_size=10, code_share=0.4, code_slip=0.3))
    first = next(batches)
    assert len(first) == 10 and sum(r.startswith("```python") for _, r in first) == 4
    programs = [(p, r) for _ in range(100) for p, r in next(batches) if r.startswith("```python")]
    slipped = [p for p, r in programs if r != _gold(p)]
    assert 0.2 < len(slipped) / len(programs) < 0.4  # about code_slip of them carry one wrong line


def _gold(prompt: str) -> str:
    """The gold program of a tiny code prompt, from its text."""
    phrases = prompt.removeprefix("Python: read x; ").removesuffix("; print x.").split("; ")
    names = {op.phrase.split(" {k}")[0]: name for name, op in OPS.items()}
    steps = []
    for phrase in phrases:
        head, _, k = phrase.rpartition(" ")
        steps.append((names[head], int(k)) if head in names else (names[phrase], 0))
    return CodeTask(tuple(steps), (), ()).response
