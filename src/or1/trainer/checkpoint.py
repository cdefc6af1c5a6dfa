"""Atomic, resumable checkpoints of one stage: runs/<name>/stage<N>/checkpoints/step_<k>/.

A checkpoint is written into `step_<k>.tmp/` (workers write the HF model, optimizer and their RNG states; the
controller writes controller.pt last), then renamed to `step_<k>/`; only then is the `latest` pointer replaced.
A kill at any moment therefore leaves either the previous checkpoint or the new one complete, never a half one
that resume would pick: `.tmp` folders are ignored (and swept), and a folder counts only with its controller.pt.

Contents of step_<k>/: model/ (HF-loadable weights + config + tokenizer, optimizer.pt), rng_rank<r>.pt per worker,
controller.pt (step, loader position, entropy controller, prompt statistics, controller RNG).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from or1.atomic import atomic_path, write_text_atomically
from or1.errors import UserError
from or1.layout import CHECKPOINTS_DIR

CONTROLLER_FILE = "controller.pt"
LATEST_FILE = "latest"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointManager:
    """Writes, finds and prunes the checkpoints of one stage directory."""

    def __init__(self, stage_dir: Path, keep: int):
        self.root = stage_dir / CHECKPOINTS_DIR
        self.keep = keep

    def begin(self, step: int) -> Path:
        """A fresh `step_<k>.tmp/` for the workers and the controller to write into."""
        tmp = self.root / f"step_{step}.tmp"
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        return tmp

    def commit(self, tmp: Path, step: int, controller_state: dict[str, Any]) -> Path:
        """Write the controller state, rename into place, move the `latest` pointer, drop old checkpoints."""
        _atomic_save(controller_state, tmp / CONTROLLER_FILE)
        final = self.root / f"step_{step}"
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
            match = _STEP_DIR.match(child.name)
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
            for child in self.root.glob("step_*.tmp"):
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


def controller_rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def restore_controller_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _atomic_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
