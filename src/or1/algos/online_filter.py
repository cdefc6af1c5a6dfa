"""Online filtering between stages: per-prompt solve counts of one stage, and dropping the prompts it always solved.

A response counts as solved when its reward >= success_threshold (1.0: full credit on or1's binary rewards).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from or1.algos.filters import as_numpy
from or1.atomic import atomic_path
from or1.errors import UserError


class PromptStats:
    """Per-prompt solve counts over one stage (attempts and solved responses per prompt uid).

    Fed with every scored rollout of every step, BEFORE rejection sampling (the always-solved groups are exactly the
    ones rejection sampling drops). Saved as runs/<name>/stage<N>/prompt_stats.parquet (columns uid, attempts,
    solved), which the next stage's online filter reads.
    """

    def __init__(self) -> None:
        self.attempts: dict[str, int] = {}
        self.solved: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.attempts)

    def update(
        self,
        uids: Iterable,
        rewards: torch.Tensor | np.ndarray | Sequence[float],
        *,
        success_threshold: float = 1.0,
    ) -> None:
        """Count one step's responses: `uids` is the prompt uid of each response (stored as str)."""
        r = as_numpy(rewards)
        uids = [str(u) for u in uids]
        if len(uids) != len(r):
            raise ValueError(f"got {len(uids)} uids but {len(r)} rewards")
        for uid, ok in zip(uids, r >= success_threshold, strict=True):
            self.attempts[uid] = self.attempts.get(uid, 0) + 1
            self.solved[uid] = self.solved.get(uid, 0) + int(ok)

    def solve_rate(self, uid: str) -> float | None:
        """solved / attempts, or None for a prompt never sampled."""
        n = self.attempts.get(str(uid), 0)
        return self.solved[str(uid)] / n if n else None

    def state_dict(self) -> dict[str, dict[str, int]]:
        """JSON-safe copy for checkpoints (the stage's counts so far)."""
        return {"attempts": dict(self.attempts), "solved": dict(self.solved)}

    def load_state_dict(self, state: dict[str, dict[str, int]]) -> None:
        self.attempts = {str(k): int(v) for k, v in state["attempts"].items()}
        self.solved = {str(k): int(v) for k, v in state["solved"].items()}

    def to_table(self) -> pa.Table:
        uids = sorted(self.attempts)
        return pa.table(
            {
                "uid": pa.array(uids, pa.string()),
                "attempts": pa.array([self.attempts[u] for u in uids], pa.int64()),
                "solved": pa.array([self.solved[u] for u in uids], pa.int64()),
            }
        )

    def save(self, path: str | os.PathLike) -> None:
        """Write the parquet file atomically (write aside, then rename), so a kill never leaves half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            pq.write_table(self.to_table(), tmp)

    @classmethod
    def load(cls, path: str | os.PathLike) -> PromptStats:
        """Read a file written by `save`; a missing or malformed file is a UserError."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"no prompt statistics at {path}; run the previous stage to its end first.")
        table = pq.read_table(path)
        missing = {"uid", "attempts", "solved"} - set(table.column_names)
        if missing:
            raise UserError(f"{path} lacks columns {sorted(missing)}; it is not an or1 prompt_stats file.")
        out = cls()
        for uid, a, s in zip(
            *(table.column(c).to_pylist() for c in ("uid", "attempts", "solved")), strict=True
        ):
            out.attempts[str(uid)], out.solved[str(uid)] = int(a), int(s)
        return out


@dataclass(frozen=True)
class OnlineFilterReport:
    """Counts of one stage-start filtering, for the log and the stage summary."""

    total: int  # prompts in the training set
    seen: int  # of those, sampled during the previous stage
    dropped: int  # solve rate >= threshold
    kept: int
    threshold: float


def online_filter(
    train_uids: Sequence, stats: PromptStats, threshold: float = 1.0
) -> tuple[list, OnlineFilterReport]:
    """Drop the prompts whose solve rate over the previous stage is >= threshold (1.0: solved every time).

    Prompts the previous stage never sampled are kept. Returns the kept uids in their original order and counts.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"online filter threshold must be in (0, 1], got {threshold}")
    kept, seen = [], 0
    for uid in train_uids:
        rate = stats.solve_rate(uid)
        seen += rate is not None
        if rate is None or rate < threshold:
            kept.append(uid)
    report = OnlineFilterReport(
        total=len(train_uids),
        seen=seen,
        dropped=len(train_uids) - len(kept),
        kept=len(kept),
        threshold=threshold,
    )
    return kept, report
