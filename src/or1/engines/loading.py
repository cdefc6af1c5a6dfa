"""Load a causal LM, a value model or a rollout engine from a local folder or hub id, the same way everywhere in or1.

`load_rollout_engine` is the one place that picks the engine (`rollout.engine` / `--engine`: the Hugging Face loop
or vLLM): the training ranks, validation, `or1 eval`, the tiny solve-rate check and difficulty estimation all build
theirs here, so the interface module (`or1.engines.rollout`) imports no implementation. Tokenizers load in
`or1.tokens`. transformers is imported where it is used: its Auto classes pull in the modeling stack
(torch.distributed, dynamo: seconds of CPU).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from or1.engines.rollout import EngineSettings
from or1.errors import UserError

ENGINES = ("hf", "vllm")

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from or1.engines.rollout import RolloutEngine


def load_causal_lm(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A causal LM from a model folder or hub id, in `dtype` (default float32), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    dtype = dtype or torch.float32
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    except OSError as err:
        raise UserError(f"Cannot load a model from {path}: {err}") from None
    return model.eval()


def load_value_model(path: str | Path, dtype: torch.dtype | None = None) -> PreTrainedModel:
    """A critic: the model's transformer with a one-output token head (new when `path` is a causal LM), no dropout.

    From a causal LM folder the LM head is dropped and the value head initialised from the global torch RNG, so seed
    it identically on every rank; from a folder a critic saved, everything loads as saved. `dtype`: float32 default.
    """
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    dtype = dtype or torch.float32
    report = logging.getLogger("transformers.modeling_utils")  # its load report lists the new head as MISSING
    level = report.level
    try:
        config = AutoConfig.from_pretrained(str(path))
        config.num_labels, config.classifier_dropout = 1, 0.0
        report.setLevel(logging.ERROR)
        model = AutoModelForTokenClassification.from_pretrained(str(path), config=config, dtype=dtype)
    except OSError as err:
        raise UserError(f"Cannot load a value model from {path}: {err}") from None
    finally:
        report.setLevel(level)
    model.config.architectures = [type(model).__name__]  # what a saved critic folder says it is
    return model.eval()


def load_rollout_engine(
    kind: str,
    model_path: str | Path,
    settings: EngineSettings,
    *,
    tokenizer: PreTrainedTokenizerBase | None = None,
    device: torch.device | None = None,
) -> RolloutEngine:
    """The rollout engine `kind` ("hf" or "vllm") over the model in `model_path`, built as `settings` say.

    `tokenizer` None: the folder's own. `device` None: a GPU when one is visible, else the CPU.
    """
    import torch

    from or1.tokens import load_tokenizer, pad_id

    if kind not in ENGINES:
        raise UserError(f"Unknown rollout engine {kind!r}; choose hf or vllm.")
    tokenizer = tokenizer if tokenizer is not None else load_tokenizer(model_path)
    gpu = torch.cuda.is_available()
    if kind == "vllm":
        from or1.engines.vllm_rollout import VLLMRolloutEngine

        return VLLMRolloutEngine(model_path, stop_ids_of(model_path, tokenizer), pad_id(tokenizer), settings)
    from or1.engines.hf_rollout import HFRolloutEngine

    model = load_causal_lm(model_path, getattr(torch, settings.dtype_on(gpu)))
    if device is not None:
        model = model.to(device)
    elif gpu:
        model = model.to("cuda")
    return HFRolloutEngine(model, tokenizer, micro_batch_size=settings.micro_batch_size)


def stop_ids_of(model_path: str | Path, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The default stop tokens of a model folder: generation_config's eos id(s), else the tokenizer's eos."""
    from transformers import GenerationConfig

    try:
        eos = GenerationConfig.from_pretrained(str(model_path)).eos_token_id
    except OSError:
        eos = None
    eos = tokenizer.eos_token_id if eos is None else eos
    if eos is None:
        raise UserError(f"{model_path}: neither generation_config.json nor the tokenizer names an eos token")
    return [eos] if isinstance(eos, int) else list(eos)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of an HF causal LM (model.model.layers for Llama / Qwen families)."""
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: cannot find decoder layers at model.model.layers")
    return list(layers)
