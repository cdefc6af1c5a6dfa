import json
import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from or1.engines.loading import load_causal_lm
from or1.errors import UserError
from or1.tinyworld.init import REPORT_FILE, _build_pinned, init_tiny_model
from or1.tinyworld.warmstart import SFTConfig
from or1.tokens import is_or1_tiny, load_tokenizer


def test_folder_is_a_standard_hf_model(tiny_model_dir):
    names = {p.name for p in tiny_model_dir.iterdir()}
    assert {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        REPORT_FILE,
    } <= names
    assert "chat_template" in json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    assert json.loads((tiny_model_dir / "config.json").read_text())["model_type"] == "qwen2"
    assert is_or1_tiny(tiny_model_dir)


def test_loads_offline_with_plain_transformers(tiny_model_dir):
    script = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast\n"
        "d = sys.argv[1]\n"
        "m = AutoModelForCausalLM.from_pretrained(d)\n"
        "t = PreTrainedTokenizerFast(tokenizer_file=d + '/tokenizer.json')\n"
        "ids = torch.tensor([t('Compute 1+2.')['input_ids']])\n"
        "print(m(ids).logits.shape[-1], len(t))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(tiny_model_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=True,
    )
    vocab_logits, vocab_tokenizer = map(int, out.stdout.split())
    assert vocab_logits == vocab_tokenizer


def test_loaders_keep_the_digit_split_and_chat_template(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir)
    assert len(tokenizer("123", add_special_tokens=False)["input_ids"]) == 3
    assert tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")
    raw = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    sample = "Compute 12-345.\n  def f(x): return {'a': x}  # done!"
    assert tokenizer(sample, add_special_tokens=False)["input_ids"] == raw.encode(sample).ids
    model = load_causal_lm(tiny_model_dir)
    assert not model.training


def test_report_shows_a_model_that_solves_some_tasks(tiny_model_dir):
    """The session's 120-step warm start learned the task's format and solves a few percent of it.

    Measured over AVX-512 / ATEN_CPU_CAPABILITY=avx2 x OR1_TEST_SEED 0..2 (AVX-512 seeds 0 / 1 / 2, then avx2):
    solve rate 4.25 / 4.75 / 7.5%, 2.75 / 3.5 / 5.5% of 200 validation problems x 2 samples (11-30 of 400); final
    warm-start loss 0.67 / 0.61 / 0.72, 0.68 / 0.61 / 0.72; truncated samples 0% on all six. A model that learned
    nothing (1 warm-start step) read loss 5.7 and 61% truncated, and still solved 1 of 400 by chance, so the solve
    rate alone cannot tell it apart: the loss and truncation checks do.
    """
    report = json.loads((tiny_model_dir / REPORT_FILE).read_text())
    rate = report["solve_rate"]
    assert 0 < rate["overall"] < 1
    assert report["sft"]["final_loss"] < 1.5
    assert rate["truncated"] < 0.25  # it answers and stops within the 96-token budget
    assert set(rate["by_difficulty"]) == {"3", "4", "5", "6"}
    assert rate["problems"] == 200
    code = report["code_solve_rate"]
    assert set(code["by_difficulty"]) == {"3", "4", "5", "6"} and code["problems"] == 100
    lengths = report["gold_lengths"]
    assert [lengths[str(n)]["max"] for n in range(2, 7)] == sorted(
        lengths[str(n)]["max"] for n in range(2, 7)
    )
    assert 1.6e6 < report["parameters"] < 1.8e6
    # where it was built and how its warm start began, for comparing two machines' builds (or1.tinyworld.shipped)
    assert len(report["sft"]["first_losses"]) == 20 and report["machine"]["cpu"]
    assert set(report["files"]) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    }


def test_refuses_to_overwrite_a_folder(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="not empty"):
        init_tiny_model(tmp_path, sft_steps=1)


def test_the_warm_start_runs_on_pinned_kernels_whatever_this_process_uses(tmp_path, monkeypatch):
    """Two warm starts from parents on torch's AVX2 and portable kernels write the same bits: the child pins its
    own (without the pin the AVX2 parent's child would run AVX2 kernels and round differently)."""
    weights = {}
    for kernel in ("avx2", "default"):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", kernel)
        built = _build_pinned(tmp_path / kernel, 0, SFTConfig(steps=3), threads=1)
        assert built["capability"] == "DEFAULT" and built["sft"]["steps"] == 3
        weights[kernel] = (tmp_path / kernel / "model.safetensors").read_bytes()
    assert weights["avx2"] == weights["default"]
