"""Load a tokenizer, causal LM or value model from a local folder or hub id, the same way everywhere in or1.

transformers is imported where it is used: its Auto classes pull in the modeling stack (torch.distributed,
dynamo: seconds of CPU), which the controller, which only tokenizes, never needs.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from or1.errors import UserError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

OR1_TINY_MARKER = "or1_tiny"  # key in config.json that init_tiny_model writes


def is_or1_tiny(path: str | Path) -> bool:
    """True when `path` is a folder written by init_tiny_model."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    return bool(json.loads(config.read_text()).get(OR1_TINY_MARKER, False))


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """The tokenizer of a model folder or hub id.

    An or1 tiny folder is loaded as a plain PreTrainedTokenizerFast from its tokenizer.json: transformers 5 swaps in
    Qwen2's own pre-tokenizer regex when AutoTokenizer sees a qwen2 config beside it, which is not the split the
    tiny model was trained on.
    """
    folder = Path(path)
    if is_or1_tiny(folder):
        # Imported alone: AutoTokenizer's module pulls in the Auto model classes and torch (seconds of CPU)
        from transformers import PreTrainedTokenizerFast

        if not (folder / "tokenizer.json").is_file():
            raise UserError(f"{folder} has no tokenizer.json; rebuild it with `or1 init-model`.")
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except OSError as err:
        raise UserError(f"Cannot load a tokenizer from {path}: {err}") from None


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
