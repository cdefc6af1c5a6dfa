"""Model paths that may be hub ids: `resolve_model` turns either into a local folder.

A local folder is used as it is. Anything else is taken as a Hugging Face hub id and looked up through
`huggingface_hub` (the local cache first; a download only when the hub is reachable and HF_HUB_OFFLINE is unset).
When the id cannot be had, the error is one line saying what to do.
"""

from __future__ import annotations

import os
from pathlib import Path

from or1.errors import UserError


def offline() -> bool:
    """True when HF_HUB_OFFLINE asks for no network access."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def resolve_model(path_or_id: str | Path, local_files_only: bool | None = None) -> Path:
    """The local folder of a model given as a folder or a hub id (`org/name`, optionally `org/name@revision`).

    `local_files_only` None follows HF_HUB_OFFLINE; True uses the cache without asking the hub.
    """
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    repo_id, _, revision = text.partition("@")
    if text.startswith((".", "/", "~")) or repo_id.count("/") != 1:
        raise UserError(f"Model {text} is not a folder and not a hub id (org/name); fix the model path.")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        local = offline() if local_files_only is None else local_files_only
        return Path(snapshot_download(repo_id, revision=revision or None, local_files_only=local))
    except LocalEntryNotFoundError:
        raise UserError(
            f"Model {repo_id} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set; download it once "
            "online (huggingface-cli download) or give a local folder."
            if offline()
            else f"Model {repo_id} is not in the local Hugging Face cache and the hub cannot be reached; download "
            "it where the hub is reachable (huggingface-cli download) or give a local folder."
        ) from None
    except Exception as err:  # unknown repo, gated repo, bad revision: one line naming the cause
        raise UserError(
            f"Cannot fetch model {repo_id} from the hub ({type(err).__name__}); check the id."
        ) from None
