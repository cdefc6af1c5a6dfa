"""The numbers of a model that decide its memory, read from its own config.json (no table of known models).

A decoder-only transformer of the Llama / Qwen2 family: embedding, `layers` blocks of grouped-query attention
(query, key, value and output projections; Qwen2 puts a bias on query, key and value) and a gated MLP (gate, up,
down), RMS norms, and an output head that may be tied to the embedding. `parameter_shapes` lists every parameter's
shape in that order, so FSDP2's per-rank shard (dim 0 split over the ranks) can be counted exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from or1.errors import UserError
from or1.hub import offline

BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
# model_type values whose attention projections carry a bias without saying so in config.json
_QKV_BIAS_TYPES = ("qwen2",)
_MOE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: layer count and widths, vocabulary, tied head, biases."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config: dict, name: str = "model") -> ModelShape:
        """From the fields of an HF config.json; a UserError names a missing field or an architecture not covered."""
        if any(config.get(key) for key in _MOE_KEYS):
            raise UserError(f"{name}: a mixture-of-experts model; or1 plan covers dense decoder models only")
        missing = [
            key
            for key in (
                "num_hidden_layers",
                "hidden_size",
                "num_attention_heads",
                "intermediate_size",
                "vocab_size",
            )
            if not config.get(key)
        ]
        if missing:
            raise UserError(
                f"{name}: config.json lacks {', '.join(missing)}; pass a decoder model's config.json"
            )
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            name=name,
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            tied=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=bool(config.get("attention_bias", config.get("model_type") in _QKV_BIAS_TYPES)),
        )

    def layer_shapes(self) -> list[tuple[int, ...]]:
        """The parameters of one decoder block, as FSDP2 shards them (one unit per block)."""
        q, kv, h = self.heads * self.head_dim, self.kv_heads * self.head_dim, self.hidden
        shapes: list[tuple[int, ...]] = [(q, h), (kv, h), (kv, h), (h, q)]
        if self.qkv_bias:
            shapes += [(q,), (kv,), (kv,)]
        shapes += [(self.intermediate, h), (self.intermediate, h), (h, self.intermediate), (h,), (h,)]
        return shapes

    def root_shapes(self) -> list[tuple[int, ...]]:
        """What the root unit owns: the embedding, the final norm and an untied output head."""
        return [(self.vocab, self.hidden), (self.hidden,)] + (
            [] if self.tied else [(self.vocab, self.hidden)]
        )

    def parameter_shapes(self) -> list[tuple[int, ...]]:
        return self.layer_shapes() * self.layers + self.root_shapes()

    @property
    def parameters(self) -> int:
        return sum(numel(s) for s in self.parameter_shapes())

    @property
    def layer_parameters(self) -> int:
        return sum(numel(s) for s in self.layer_shapes())

    @property
    def root_parameters(self) -> int:
        return sum(numel(s) for s in self.root_shapes())


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def config_file(model: str | Path, *, fetch: bool = False) -> Path | None:
    """config.json of a model given as a folder, a config.json path, or a hub id in the HF cache; with `fetch`, a
    hub id's config.json alone is downloaded when the hub can be reached (a few KB: never the weights). None when
    none can be had."""
    path = Path(model).expanduser()
    if path.is_file():
        return path
    if (path / "config.json").is_file():
        return path / "config.json"
    text = str(model)
    if text.count("/") != 1 or text.startswith((".", "/", "~")):
        return None
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    repo_id, _, revision = text.partition("@")
    found = try_to_load_from_cache(repo_id, "config.json", revision=revision or None)
    if isinstance(found, str):
        return Path(found)
    if not fetch or offline():
        return None
    try:
        return Path(hf_hub_download(repo_id, "config.json", revision=revision or None))
    except Exception:  # unreachable hub, unknown or gated repo: the caller says what it could not check
        return None


def read_model_shape(model: str | Path) -> ModelShape:
    """The shape of `model` (folder, config.json, or cached hub id); a UserError says how to give one."""
    found = config_file(model)
    if found is None:
        raise UserError(
            f"no config.json for {model} on this machine (not a folder, not in the Hugging Face cache); download "
            "it (huggingface-cli download ID config.json) or pass --model-config PATH"
        )
    try:
        config = json.loads(found.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise UserError(f"{found} is not a readable JSON file; pass a model's config.json") from None
    return ModelShape.from_config(config, name=str(model))
