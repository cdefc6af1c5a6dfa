"""An or1 export read back against its manifest.json: every file it lists there with its SHA-256, config.json's dtype
the one its safetensors shards hold (`or1.export` writes them; `or1.preflight` reads a model folder with it)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from or1.errors import UserError

MANIFEST_FILE = "manifest.json"
# safetensors' names of the dtypes an export writes
SAFETENSORS_DTYPES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


def verify_export(folder: Path) -> dict[str, Any]:
    """An export read back against its manifest: every file there with its hash, config.json's dtype the shards';
    a one-line UserError naming the first thing wrong. The manifest."""
    path = folder / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
        files: dict[str, str] = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserError(f"{folder} is not a complete or1 export ({MANIFEST_FILE}: {err})") from None
    for name, digest in files.items():
        if not (folder / name).is_file():
            raise UserError(f"{folder} lacks {name}, which its {MANIFEST_FILE} lists; export it again")
        if sha256(folder / name) != digest:
            raise UserError(f"{folder / name} differs from the file exported (SHA-256); export it again")
    declared = declared_dtype(folder)
    stored = shard_dtypes(folder)
    if stored != {SAFETENSORS_DTYPES.get(declared, declared)}:
        raise UserError(
            f"{folder / 'config.json'} says dtype {declared} but the shards hold {', '.join(sorted(stored))}"
        )
    return manifest


def declared_dtype(folder: Path) -> str | None:
    """The dtype config.json gives the weights (`dtype`, or the older `torch_dtype`)."""
    config = json.loads((folder / "config.json").read_text())
    return config.get("dtype") or config.get("torch_dtype")


def shard_dtypes(folder: Path) -> set[str]:
    """The dtypes the folder's safetensors shards hold, from their headers."""
    found = set()
    for file in folder.glob("*.safetensors"):
        with file.open("rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        found |= {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return found


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
