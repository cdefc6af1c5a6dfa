"""The files of an export: the weights in shards of a set size and dtype, the config, the tokenizer; an export
read back against its manifest (`or1.export`)."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

from or1.errors import UserError
from or1.manifest import SAFETENSORS_DTYPES, declared_dtype, shard_dtypes

INDEX_FILE = "model.safetensors.index.json"
CARD_FILE = "README.md"
DTYPES = ("float32", "bfloat16", "float16")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)


def source_tensors(folder: Path) -> list[tuple[Path, str]]:
    """Every tensor of a model folder's safetensors files, as (file, name), in the files' order."""
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UserError(f"{folder} holds no *.safetensors weights")
    out = []
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                out += [(file, name) for name in f.keys()]
        except Exception as err:  # safetensors raises its own error types for a torn or corrupted file
            raise UserError(
                f"{file} cannot be read as safetensors ({err}); the checkpoint is damaged"
            ) from None
    return out


def write_weights(src: Path, dst: Path, dtype: str, shard_bytes: int) -> None:
    """The source's tensors in `dtype`, in shards of at most `shard_bytes` (a larger tensor gets a shard of its own),
    with the index transformers and vLLM read; one source tensor in memory at a time beside the shard being filled."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = source_tensors(src)
    size = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    numels = {}
    for file in dict.fromkeys(file for file, _ in tensors):  # each file's header read once
        with safe_open(str(file), framework="pt") as f:
            numels.update({name: math.prod(f.get_slice(name).get_shape()) for name in f.keys()})
    shards: list[list[str]] = [[]]
    filled = 0
    for _, name in tensors:
        nbytes = numels[name] * size
        if shards[-1] and filled + nbytes > shard_bytes:
            shards.append([])
            filled = 0
        shards[-1].append(name)
        filled += nbytes
    where = {name: file for file, name in tensors}
    weight_map = {}
    for i, names in enumerate(shards, 1):
        shard = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        state = {}
        for name in names:
            with safe_open(str(where[name]), framework="pt") as f:
                state[name] = f.get_tensor(name).to(getattr(torch, dtype)).contiguous()
            weight_map[name] = shard
        save_file(state, str(dst / shard), metadata={"format": "pt"})
        os.chmod(dst / shard, 0o644)  # safetensors creates its files readable by their owner only
    total = sum(numels.values()) * size
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (dst / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")


def write_config(src: Path, dst: Path, dtype: str) -> None:
    """config.json with its dtype the shards' (both key spellings transformers has used), generation_config.json."""
    config = json.loads((src / "config.json").read_text())
    set_dtype(config, dtype)
    (dst / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if (src / "generation_config.json").is_file():
        shutil.copyfile(src / "generation_config.json", dst / "generation_config.json")


def copy_tokenizer(src: Path, dst: Path) -> None:
    """The source's tokenizer files as they are (the tiny tokenizer's split is in its tokenizer.json)."""
    present = [name for name in TOKENIZER_FILES if (src / name).is_file()]
    if "tokenizer_config.json" not in present or not {
        "tokenizer.json",
        "vocab.json",
        "tokenizer.model",
    } & set(present):
        raise UserError(
            f"{src} has no complete tokenizer (tokenizer_config.json and tokenizer.json, vocab.json or "
            f"tokenizer.model; found {', '.join(present) or 'none'})"
        )
    for name in present:
        shutil.copyfile(src / name, dst / name)


def set_config_dtype(folder: Path) -> None:
    """config.json's dtype set to the one its shards hold (a model loaded in float32 for training can keep the
    hub's bfloat16 in its config)."""
    names = {v: k for k, v in SAFETENSORS_DTYPES.items()}
    stored = shard_dtypes(folder)
    if len(stored) != 1 or next(iter(stored)) not in names:
        raise UserError(
            f"{folder} holds shards of {', '.join(sorted(stored)) or 'no'} dtype; expected one of F32, BF16, F16"
        )
    dtype = names[next(iter(stored))]
    if declared_dtype(folder) != dtype:
        config = json.loads((folder / "config.json").read_text())
        set_dtype(config, dtype)
        (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def set_dtype(config: dict[str, Any], dtype: str) -> None:
    """Both key spellings transformers has used."""
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
