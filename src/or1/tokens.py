"""Tokenizers, the same way everywhere in or1: load one, its pad id, and chat messages -> prompt ids.

The controller (prompt loading, validation), the ranks (rollout engines), evaluation, data preparation and the tiny
model's warm start all tokenize through these three functions, so a prompt is the same ids wherever it is sampled.
transformers is imported where it is used: its Auto classes pull in the modeling stack (torch.distributed, dynamo:
seconds of CPU), which the controller, which only tokenizes, never needs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from or1.errors import UserError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

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


def pad_id(tokenizer: PreTrainedTokenizerBase) -> int:
    """The id that pads prompts and responses: the tokenizer's pad token, else its eos."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id


def prompt_ids(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]]) -> list[int]:
    """Chat template with the assistant header appended, then token ids (no extra special tokens)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]
