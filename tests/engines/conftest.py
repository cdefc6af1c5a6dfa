"""The engine tests' model: an untrained small Qwen2, built once per module that asks for it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from or1.tinyworld.architecture import TinyModelSpec, build_tiny_model
from or1.tinyworld.tokenizer import train_tokenizer

SPEC = TinyModelSpec(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An untrained small Qwen2 (the engine's arithmetic does not care whether it can do sums)."""
    out = tmp_path_factory.mktemp("fsdp_model")
    tokenizer = train_tokenizer([f"Compute {a}+{b}. {a}+{b}={a + b}." for a in range(10) for b in range(10)])
    seed = int(os.environ.get("OR1_TEST_SEED", "0"))  # the tiny world's seed: see tests/conftest.py
    build_tiny_model(tokenizer, seed=seed, spec=SPEC).save_pretrained(out)
    return out
