import copy
import math

import pytest
import torch

from or1.data.synthetic import math_validation_rows
from or1.engines.hf_rollout import HFRolloutEngine, SamplingParams, sample_next
from or1.engines.loading import load_causal_lm
from or1.errors import UserError
from or1.tokens import load_tokenizer, prompt_ids

GREEDY = SamplingParams(temperature=0.0, max_response_length=40)


@pytest.fixture(scope="module")
def world(tiny_model_dir):
    model, tokenizer = load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)
    rows = math_validation_rows()[::25]  # 8 prompts, 3..6 operands, of different token lengths
    prompts = [prompt_ids(tokenizer, list(r["prompt"])) for r in rows]
    assert len({len(p) for p in prompts}) > 1
    return model, tokenizer, prompts


def _reference_greedy(model, prompt, steps, eos):
    """Greedy decoding by full recomputation, no cache and no padding: the definition the engine must meet."""
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token == eos:
                break
    return out


def test_greedy_matches_full_recomputation_despite_left_padding(world):
    model, tokenizer, prompts = world
    out = HFRolloutEngine(model, tokenizer).generate_ids(prompts, GREEDY)
    for prompt, response in zip(prompts, out.responses, strict=True):
        assert response == _reference_greedy(
            model, prompt, GREEDY.max_response_length, tokenizer.eos_token_id
        )


def test_greedy_matches_hf_generate(world):
    model, tokenizer, prompts = world
    ours = HFRolloutEngine(model, tokenizer, micro_batch_size=3).generate_ids(prompts, GREEDY).responses
    for prompt, response in zip(prompts, ours, strict=True):
        with torch.no_grad():
            theirs = model.generate(
                torch.tensor([prompt]),
                do_sample=False,
                max_new_tokens=GREEDY.max_response_length,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        assert response == theirs[0, len(prompt) :].tolist()


def test_rows_are_prompt_major_and_stop_tokens_end_responses(world):
    model, tokenizer, prompts = world
    engine = HFRolloutEngine(model, tokenizer, micro_batch_size=5)
    sampling = SamplingParams(n=3, temperature=1.0, max_response_length=24, seed=0)
    out = engine.generate_ids(prompts, sampling)
    assert len(out.responses) == len(out.truncated) == 3 * len(prompts)
    eos = tokenizer.eos_token_id
    for response, truncated in zip(out.responses, out.truncated, strict=True):
        assert eos not in response[:-1]
        if truncated:
            assert len(response) == 24 and response[-1] != eos
        else:
            assert response[-1] == eos
    greedy = engine.generate_ids(prompts, SamplingParams(n=2, temperature=0.0, max_response_length=24))
    single = [
        engine.generate_ids([p], SamplingParams(temperature=0.0, max_response_length=24)).responses[0]
        for p in prompts
    ]
    assert greedy.responses[0::2] == greedy.responses[1::2] == single


def test_seeded_sampling_is_reproducible(world):
    model, tokenizer, prompts = world
    engine = HFRolloutEngine(model, tokenizer)
    a = engine.generate_ids(prompts, SamplingParams(n=4, seed=1, max_response_length=32)).responses
    b = engine.generate_ids(prompts, SamplingParams(n=4, seed=1, max_response_length=32)).responses
    c = engine.generate_ids(prompts, SamplingParams(n=4, seed=2, max_response_length=32)).responses
    assert a == b
    assert a != c


def test_tiny_top_p_is_greedy(world):
    model, tokenizer, prompts = world
    engine = HFRolloutEngine(model, tokenizer)
    nucleus = engine.generate_ids(
        prompts, SamplingParams(top_p=1e-6, seed=0, max_response_length=40)
    ).responses
    assert nucleus == engine.generate_ids(prompts, GREEDY).responses


def test_max_new_tokens_truncates(world):
    model, tokenizer, prompts = world
    out = HFRolloutEngine(model, tokenizer).generate_ids(
        prompts, SamplingParams(max_response_length=3, seed=0)
    )
    assert all(len(r) == 3 for r in out.responses)
    assert all(out.truncated)


def test_custom_stop_tokens(world):
    model, tokenizer, prompts = world
    stop = tokenizer.convert_tokens_to_ids("=")
    out = HFRolloutEngine(model, tokenizer).generate_ids(
        prompts, SamplingParams(temperature=0.0, max_response_length=40, stop_token_ids=[stop])
    )
    for response, truncated in zip(out.responses, out.truncated, strict=True):
        assert truncated or (response[-1] == stop and stop not in response[:-1])
    assert not all(out.truncated)


def test_sample_next_respects_top_p_and_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(4000, 1)
    gen = torch.Generator().manual_seed(0)
    assert set(sample_next(logits, 1.0, 0.7, gen)[0].tolist()) == {0, 1}
    assert set(sample_next(logits, 1.0, 0.85, gen)[0].tolist()) == {0, 1, 2}
    counts = torch.bincount(sample_next(logits, 1.0, 1.0, gen)[0], minlength=4) / 4000
    assert torch.allclose(counts, torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=0.03)
    sharp = torch.bincount(sample_next(logits, 0.5, 1.0, gen)[0], minlength=4) / 4000
    assert sharp[0] == pytest.approx(0.25 / (0.25 + 0.09 + 0.0225 + 0.0025), abs=0.03)
    assert sample_next(logits[:2], 0.0, 1.0, None)[0].tolist() == [0, 0]
    assert not math.isnan(float(counts.sum()))


def test_sample_next_returns_the_log_prob_under_the_sampling_distribution():
    """Temperature and top_p applied, then renormalised: the quantity vLLM's processed_logprobs reports."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(200, 1)
    gen = torch.Generator().manual_seed(0)
    tokens, log_probs = sample_next(logits, 1.0, 0.7, gen)  # nucleus {0, 1}: 0.5 / 0.8 and 0.3 / 0.8
    expected = torch.tensor([math.log(0.5 / 0.8), math.log(0.3 / 0.8)])[tokens]
    assert torch.allclose(log_probs, expected, atol=1e-6)
    tokens, log_probs = sample_next(logits, 0.5, 1.0, gen)  # p^2 renormalised
    squares = torch.tensor([0.25, 0.09, 0.0225, 0.0025])
    assert torch.allclose(log_probs, (squares / squares.sum()).log()[tokens], atol=1e-6)


def test_load_weights_copies_in_place(world):
    model, tokenizer, prompts = world
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    engine = HFRolloutEngine(other, tokenizer)
    assert (
        engine.generate_ids(prompts, GREEDY).responses
        != HFRolloutEngine(model, tokenizer).generate_ids(prompts, GREEDY).responses
    )
    weight = other.model.embed_tokens.weight
    engine.load_weights(model.state_dict().items())  # includes lm_head.weight, tied to the embedding
    assert other.model.embed_tokens.weight is weight
    assert (
        engine.generate_ids(prompts, GREEDY).responses
        == HFRolloutEngine(model, tokenizer).generate_ids(prompts, GREEDY).responses
    )
    with pytest.raises(KeyError, match="no tensor named"):
        engine.load_weights([("not.a.weight", torch.zeros(1))])
    engine.sleep()
    engine.wake_up()


def test_bad_sampling_is_a_user_error(world):
    model, tokenizer, prompts = world
    engine = HFRolloutEngine(model, tokenizer)
    with pytest.raises(UserError):
        engine.generate_ids(prompts, SamplingParams(n=0))
    with pytest.raises(UserError):
        engine.generate_ids(prompts, SamplingParams(top_p=0.0))
    with pytest.raises(UserError):
        engine.generate_ids([[]], SamplingParams())
