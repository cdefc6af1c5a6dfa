"""resolve_model: a folder as it is, a hub id from the local cache offline, one clear line when it is missing."""

from __future__ import annotations

from pathlib import Path

import pytest

from or1.errors import UserError
from or1.hub import resolve_model


def test_a_local_folder_is_used_as_it_is(tmp_path: Path):
    assert resolve_model(tmp_path) == tmp_path
    assert resolve_model(str(tmp_path)) == tmp_path


def test_a_cached_hub_id_resolves_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--tiny-org--tiny-model"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("tiny-org/tiny-model") == snapshot


def test_a_missing_id_offline_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE is set"):
        resolve_model("nobody/no-such-model")
    with pytest.raises(UserError, match="not a folder and not a hub id"):
        resolve_model(tmp_path / "missing-folder")


def test_train_and_eval_take_a_cached_hub_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`model.path` / `--model` given as a hub id resolve to the cached snapshot; a missing one is one line."""
    import huggingface_hub.constants

    from or1.preflight import check_model

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--tiny-org--tiny-model"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text('{"model_type": "qwen2"}')
    (snapshot / "model.safetensors").write_bytes(b"")
    (snapshot / "tokenizer.json").write_text("{}")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert check_model("tiny-org/tiny-model", "model.path:") == snapshot
    with pytest.raises(
        UserError, match="--model nobody/absent is neither a local folder nor a reachable hub"
    ):
        check_model("nobody/absent", "--model", timeout=1.0)
