"""Atomic, resumable checkpoints of one stage, from its stateful parts: runs/<name>/stage<N>/checkpoints/step_<k>/.

A stage's state is its parts: the worker groups (each rank writes its own files: the HF model, optimizer and RNG) and
the controller's parts, each with `state_dict()` / `load_state_dict()` (data position, entropy controller, prompt
statistics, skipped steps, the controller's RNG), saved together in controller.pt under their names. The file names
are `or1.layout`'s.

A checkpoint is written into `step_<k>.tmp/` (the workers first, controller.pt last), then renamed to `step_<k>/`;
only then is the `latest` pointer replaced. A kill at any moment therefore leaves either the previous checkpoint or
the new one complete, never a half one that resume would pick: `.tmp` folders are ignored (and swept), and a folder
counts only with its controller.pt.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from or1.atomic import atomic_path, write_text_atomically
from or1.errors import UserError
from or1.layout import (
    CHECKPOINT_MODEL_DIR,
    CHECKPOINT_STEP,
    CHECKPOINTS_DIR,
    CONTROLLER_FILE,
    LATEST_FILE,
    checkpoint_directory,
    rank_rng_file,
)


class Stateful(Protocol):
    """A part of the controller's state that goes into every checkpoint (controller.pt, under its name)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointPart(Protocol):
    """A part that writes its own files into the checkpoint folder: a worker group (every rank its files) or the
    separate placement (the older weight versions the steps after a resume sample with)."""

    def save_checkpoint(self, path: str) -> object: ...

    def load_checkpoint(self, path: str) -> object: ...


class CheckpointManager:
    """Writes, finds and prunes the checkpoints of one stage directory; saves and loads the stage's parts."""

    def __init__(
        self,
        stage_dir: Path,
        keep: int,
        workers: Sequence[CheckpointPart] = (),
        parts: Mapping[str, Stateful] | None = None,
    ):
        self.stage_dir = stage_dir
        self.root = stage_dir / CHECKPOINTS_DIR
        self.keep = keep
        self.workers = list(workers)  # the actor's worker group first: its ranks' files are checked
        self.parts = dict(parts or {})

    def folder(self, step: int) -> Path:
        """Where the complete checkpoint of `step` is."""
        return checkpoint_directory(self.stage_dir, step)

    def save(self, step: int) -> Path:
        """Every part's state at `step`, committed atomically; the checkpoint folder."""
        folder = self.begin(step)
        for group in self.workers:
            group.save_checkpoint(str(folder))
        if self.workers:
            ranks = range(self.workers[0].world_size)
            check_visible(folder, [f"{CHECKPOINT_MODEL_DIR}/config.json", *map(rank_rng_file, ranks)])
        state = {"step": step, **{name: part.state_dict() for name, part in self.parts.items()}}
        return self.commit(folder, step, state)

    def load(self, folder: Path) -> int:
        """Load a checkpoint into every part; its step. A part absent from the checkpoint (one written before the
        part existed) keeps its fresh state."""
        state = load_controller_state(folder)
        for group in self.workers:
            group.load_checkpoint(str(folder))
        for name, part in self.parts.items():
            if name in state:
                part.load_state_dict(state[name])
        return int(state["step"])

    def begin(self, step: int) -> Path:
        """A fresh `step_<k>.tmp/` for the workers and the controller to write into."""
        tmp = self.folder(step).with_suffix(".tmp")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, controller_state: dict[str, Any]) -> Path:
        """Write the controller state, rename into place, move the `latest` pointer, drop old checkpoints."""
        _atomic_save(controller_state, tmp / CONTROLLER_FILE)
        final = self.folder(step)
        if final.exists():  # a rerun of the same step (e.g. resumed from an earlier checkpoint)
            shutil.rmtree(final)
        os.replace(tmp, final)
        write_text_atomically(self.root / LATEST_FILE, final.name + "\n")
        self.prune()
        return final

    def complete(self) -> list[tuple[int, Path]]:
        """Complete checkpoints as (step, folder), oldest first."""
        if not self.root.is_dir():
            return []
        found = []
        for child in self.root.iterdir():
            match = CHECKPOINT_STEP.match(child.name)
            if match and (child / CONTROLLER_FILE).is_file():
                found.append((int(match.group(1)), child))
        return sorted(found)

    def latest(self) -> Path | None:
        """The newest complete checkpoint (the `latest` pointer is a hint for humans; the folders decide)."""
        found = self.complete()
        return found[-1][1] if found else None

    def sweep_partial(self) -> None:
        """Remove `.tmp` folders left by a run killed while writing."""
        if self.root.is_dir():
            for child in self.root.glob("*.tmp"):
                shutil.rmtree(child, ignore_errors=True)

    def prune(self) -> None:
        for _, folder in self.complete()[: -self.keep]:
            shutil.rmtree(folder, ignore_errors=True)


def check_visible(folder: Path, expected: list[str]) -> None:
    """The files the workers just wrote into a checkpoint folder are all visible from the controller.

    Each rank writes into the folder from its own machine; on a multi-node cluster the run directory must be storage
    that every node mounts (NFS, a parallel file system), or the controller would commit a checkpoint that lacks
    other nodes' files. A UserError names what is missing.
    """
    missing = [name for name in expected if not (folder / name).exists()]
    if missing:
        raise UserError(
            f"checkpoint {folder} lacks {', '.join(missing)} as seen from the controller: the workers wrote them on "
            "another machine, so the run directory is not shared storage; pass --run-dir on storage that every "
            "node mounts"
        )


def load_controller_state(folder: Path) -> dict[str, Any]:
    return torch.load(folder / CONTROLLER_FILE, weights_only=False)


def _atomic_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
