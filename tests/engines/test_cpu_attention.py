"""The CPU grouped-query attention gives transformers' sdpa results: padded and packed training windows (outputs and
gradients), and the HF rollout's KV-cached sampling (the same tokens for the same seed)."""

from __future__ import annotations

from pathlib import Path

import torch
from test_fsdp_engine import make_batch

from or1.data.synthetic import math_validation_rows
from or1.engines.cpu_attention import GROUPED_SDPA, use_grouped_sdpa
from or1.engines.hf_rollout import HFRolloutEngine
from or1.engines.loading import load_causal_lm
from or1.engines.packing import packed_window, padded_window
from or1.engines.rollout import SamplingParams
from or1.tokens import load_tokenizer, prompt_ids


def _outputs_and_grads(model: torch.nn.Module, window) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    logits = model(**window.inputs, use_cache=False).logits
    out = window.picked(logits)
    out.square().mean().backward()
    return out.detach(), [p.grad.clone() for p in model.parameters()]


def test_grouped_sdpa_equals_sdpa_on_training_windows(model_dir: Path) -> None:
    sdpa, grouped = load_causal_lm(model_dir), load_causal_lm(model_dir)
    use_grouped_sdpa(grouped)
    assert sdpa.config._attn_implementation == "sdpa"
    # the model has 4 query heads over 2 key/value heads
    assert grouped.config._attn_implementation == GROUPED_SDPA
    micro = make_batch(8).tensors
    for window in (padded_window(micro), packed_window(micro)):
        expected, expected_grads = _outputs_and_grads(sdpa, window)
        got, grads = _outputs_and_grads(grouped, window)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        for g, e in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-4)


def test_the_rollout_samples_the_same_tokens(tiny_model_dir: Path) -> None:
    tokenizer = load_tokenizer(tiny_model_dir)
    # prompts of 3 to 6 operands (different lengths: left padding), 8 samples each up to the longest answer
    prompts = [prompt_ids(tokenizer, list(r["prompt"])) for r in math_validation_rows()[::25]]
    sampling = SamplingParams(n=8, temperature=1.0, top_p=1.0, max_response_length=48, seed=7)
    engine = HFRolloutEngine(load_causal_lm(tiny_model_dir), tokenizer)
    assert engine.model.config._attn_implementation == GROUPED_SDPA  # the engine switched the CPU model over
    reference = HFRolloutEngine(load_causal_lm(tiny_model_dir), tokenizer)
    reference.model.set_attn_implementation("sdpa")
    got, expected = engine.generate_ids(prompts, sampling), reference.generate_ids(prompts, sampling)
    assert got.responses == expected.responses
    torch.testing.assert_close(
        torch.tensor(sum(got.log_probs, [])), torch.tensor(sum(expected.log_probs, [])), atol=1e-5, rtol=1e-5
    )


def test_models_without_grouped_heads_or_on_eager_are_left_alone(model_dir: Path) -> None:
    eager = load_causal_lm(model_dir)
    eager.set_attn_implementation("eager")
    use_grouped_sdpa(eager)
    assert eager.config._attn_implementation == "eager"
    model = load_causal_lm(model_dir)
    model.config.num_key_value_heads = model.config.num_attention_heads
    use_grouped_sdpa(model)
    assert model.config._attn_implementation == "sdpa"
