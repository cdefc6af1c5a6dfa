"""Which responses a step trains on: rejection sampling and DAPO-style refill.

- `rejection_keep_indices`: Skywork's rejection sampling: drop groups whose rewards are all equal (their GRPO
  advantage is 0), then trim to a multiple of the data-parallel size; empty means skip the step.
- `RefillBuffer`: DAPO-style dynamic sampling: keep sampling extra rounds until enough informative groups exist.

A response counts as solved when its reward >= success_threshold (1.0: full credit on or1's binary rewards).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from or1.algos.advantages import group_index

_EQUAL_ATOL = 1e-9  # rewards closer than this count as equal (binary rewards are exactly 0 / 1)


def as_numpy(rewards: torch.Tensor | np.ndarray | Sequence[float]) -> np.ndarray:
    if isinstance(rewards, torch.Tensor):
        return rewards.detach().to("cpu", torch.float64).numpy()
    return np.asarray(rewards, dtype=np.float64)


@dataclass(frozen=True)
class GroupStats:
    """Per-group reward summary of one batch; groups are numbered in order of first appearance."""

    index: np.ndarray  # [B] dense group number of each response
    sizes: np.ndarray  # [G] responses per group
    means: np.ndarray  # [G] mean reward
    all_equal: np.ndarray  # [G] bool: zero reward variance (no learning signal under GRPO)
    solve_all: np.ndarray  # [G] bool: every response solved
    solve_none: np.ndarray  # [G] bool: no response solved

    @property
    def num_groups(self) -> int:
        return len(self.sizes)

    def _frac(self, flags: np.ndarray) -> float:
        return float(flags.mean()) if len(flags) else 0.0

    @property
    def all_equal_frac(self) -> float:
        return self._frac(self.all_equal)

    @property
    def solve_all_frac(self) -> float:
        return self._frac(self.solve_all)

    @property
    def solve_none_frac(self) -> float:
        return self._frac(self.solve_none)


def group_reward_stats(
    rewards: torch.Tensor | np.ndarray | Sequence[float],
    group_ids: Sequence | np.ndarray,
    *,
    success_threshold: float = 1.0,
) -> GroupStats:
    """Summarise rewards per group (group_ids: the prompt uid of each response)."""
    r = as_numpy(rewards)
    if len(r) != len(group_ids):
        raise ValueError(f"got {len(r)} rewards but {len(group_ids)} group ids")
    idx, g = group_index(group_ids)
    sizes = np.bincount(idx, minlength=g)
    means = np.bincount(idx, weights=r, minlength=g) / np.maximum(sizes, 1)
    hi = np.full(g, -np.inf)
    lo = np.full(g, np.inf)
    np.maximum.at(hi, idx, r)
    np.minimum.at(lo, idx, r)
    solved = np.bincount(idx, weights=(r >= success_threshold).astype(np.float64), minlength=g)
    return GroupStats(
        index=idx,
        sizes=sizes,
        means=means,
        all_equal=(hi - lo) <= _EQUAL_ATOL,
        solve_all=solved == sizes,
        solve_none=solved == 0,
    )


@dataclass(frozen=True)
class RejectionStats:
    """What rejection sampling did to one step's batch (logged every step)."""

    num_responses: int
    num_groups: int
    kept_responses: int
    kept_groups: int  # groups with at least one kept response
    zero_variance_frac: float  # groups dropped for equal rewards / groups
    dropped_frac: float  # responses dropped in total (equal rewards + trimming) / responses
    trimmed: int  # responses of informative groups dropped only to reach the multiple
    solve_all_frac: float
    solve_none_frac: float

    @property
    def skip(self) -> bool:
        """Nothing left to train on: skip the step."""
        return self.kept_responses == 0


def _min_drop(sizes: Sequence[int], multiple: int) -> list[int]:
    """Positions (into `sizes`) of whole groups to drop so the rest sums to a multiple of `multiple`.

    Drops as few responses as possible; among equal choices it prefers groups late in the list. Dynamic programme
    over residues mod `multiple`, O(len(sizes) * multiple).
    """
    excess = sum(sizes) % multiple
    if excess == 0:
        return []
    inf = float("inf")
    # best[r]: fewest responses dropped such that the dropped total = r (mod multiple)
    best = [0.0] + [inf] * (multiple - 1)
    took: list[list[bool]] = []  # took[k][r]: stage k reached residue r by dropping position len(sizes)-1-k
    for pos in reversed(range(len(sizes))):
        new_best, step_took = best[:], [False] * multiple
        for r in range(multiple):
            to = (r + sizes[pos]) % multiple
            if best[r] + sizes[pos] < new_best[to]:
                new_best[to], step_took[to] = best[r] + sizes[pos], True
        best = new_best
        took.append(step_took)
    # dropping every group reaches residue `excess`, so a solution always exists; walk the choices back
    drop, r = [], excess
    for k in reversed(range(len(sizes))):
        pos = len(sizes) - 1 - k
        if took[k][r]:
            drop.append(pos)
            r = (r - sizes[pos]) % multiple
    return drop


def rejection_keep_indices(
    rewards: torch.Tensor | np.ndarray | Sequence[float],
    group_ids: Sequence | np.ndarray,
    *,
    multiple: int = 1,
    rng: np.random.Generator | None = None,
    drop_equal: bool = True,
    success_threshold: float = 1.0,
) -> tuple[np.ndarray, RejectionStats]:
    """Indices (ascending) of the responses to train on, and what was dropped.

    1. Drop every group whose rewards are all equal (all 0 or all 1 with binary rewards); drop_equal=False skips
       this and only trims (e.g. after a RefillBuffer, whose groups are all informative already).
    2. Trim to a multiple of `multiple` (the data-parallel size). Whole groups are dropped when that loses no more
       responses than trimming single responses would (always the case when the group size divides `multiple` or
       vice versa); otherwise, e.g. groups of 3 on 4 ranks, the trailing responses of the last kept group are cut
       (Skywork's behaviour), and that group trains on the responses left: its advantages are computed later,
       over those. Which groups go: the last ones in batch order, or a random choice when `rng` is given.
    An empty result (fewer informative responses than `multiple`) means: skip this step.
    """
    if multiple < 1:
        raise ValueError(f"multiple must be >= 1, got {multiple}")
    stats = group_reward_stats(rewards, group_ids, success_threshold=success_threshold)
    informative = ~stats.all_equal if drop_equal else np.ones(stats.num_groups, dtype=bool)
    order = np.arange(stats.num_groups) if rng is None else rng.permutation(stats.num_groups)
    order = [int(g) for g in order if informative[g]]
    sizes = [int(stats.sizes[g]) for g in order]
    total = sum(sizes)
    target = total // multiple * multiple
    dropped = set(_min_drop(sizes, multiple))
    if total - sum(sizes[p] for p in dropped) == target:
        keep_groups, partial = [g for p, g in enumerate(order) if p not in dropped], 0
    else:  # whole groups would lose more than single responses: fill up to target, cutting the last group
        keep_groups, partial, acc = [], 0, 0
        for g, s in zip(order, sizes, strict=True):
            if acc + s <= target:
                keep_groups.append(g)
                acc += s
            else:
                partial, cut_group = target - acc, g
                break
    keep_mask = np.isin(stats.index, keep_groups)
    if partial:
        members = np.flatnonzero(stats.index == cut_group)
        keep_mask[members[:partial]] = True
    keep = np.flatnonzero(keep_mask).astype(np.int64)
    n = len(stats.index)
    report = RejectionStats(
        num_responses=n,
        num_groups=stats.num_groups,
        kept_responses=len(keep),
        kept_groups=len(np.unique(stats.index[keep])),
        zero_variance_frac=float((~informative).mean()) if stats.num_groups else 0.0,
        dropped_frac=1.0 - len(keep) / n if n else 0.0,
        trimmed=total - len(keep),
        solve_all_frac=stats.solve_all_frac,
        solve_none_frac=stats.solve_none_frac,
    )
    return keep, report


class RefillBuffer:
    """DAPO-style dynamic sampling: collect informative groups over extra sampling rounds until a target count.

    The buffer holds no data, only counts: `add` returns which responses of this round to keep (the caller selects
    them from its batch and concatenates the parts), so it works with any batch type. Groups are taken in order of
    first appearance and the last ones beyond the target are dropped, so the result is deterministic. Typical use:

        buf = RefillBuffer(target_groups=batch_size, max_rounds=cfg.max_refill_rounds)
        while buf.needs_more:
            part = sample_and_score(next_prompts())
            parts.append(part.select(buf.add(part.rewards, part.uids)))
        batch = concat(parts)  # then rejection_keep_indices(..., drop_equal=False, multiple=dp) to trim

    Round 1 is the step's normal sampling; `max_rounds` counts the extra ones.
    """

    def __init__(self, target_groups: int, max_rounds: int, *, success_threshold: float = 1.0) -> None:
        if target_groups < 1 or max_rounds < 0:
            raise ValueError(
                f"need target_groups >= 1 and max_rounds >= 0, got {target_groups}, {max_rounds}"
            )
        self.target_groups, self.max_rounds = target_groups, max_rounds
        self.success_threshold = success_threshold
        self.rounds = 0
        self.num_groups = 0  # informative groups collected
        self.num_responses = 0
        self.groups_seen = 0
        self._solve_all = 0
        self._solve_none = 0

    @property
    def full(self) -> bool:
        return self.num_groups >= self.target_groups

    @property
    def exhausted(self) -> bool:
        return self.rounds >= 1 + self.max_rounds

    @property
    def needs_more(self) -> bool:
        """Sample another round: not full yet and rounds left."""
        return not self.full and not self.exhausted

    def add(
        self, rewards: torch.Tensor | np.ndarray | Sequence[float], group_ids: Sequence | np.ndarray
    ) -> np.ndarray:
        """Take one round's scored responses; return the (ascending) indices of those to keep."""
        if self.exhausted:
            raise RuntimeError(f"RefillBuffer: all {1 + self.max_rounds} sampling rounds are used")
        stats = group_reward_stats(rewards, group_ids, success_threshold=self.success_threshold)
        self.rounds += 1
        self.groups_seen += stats.num_groups
        self._solve_all += int(stats.solve_all.sum())
        self._solve_none += int(stats.solve_none.sum())
        room = max(0, self.target_groups - self.num_groups)
        taken = np.flatnonzero(~stats.all_equal)[:room]
        keep = np.flatnonzero(np.isin(stats.index, taken)).astype(np.int64)
        self.num_groups += len(taken)
        self.num_responses += len(keep)
        return keep

    def metrics(self) -> dict[str, float]:
        """refill_rounds, refill_groups, and solve-all / solve-none fractions over every group sampled."""
        seen = max(self.groups_seen, 1)
        return {
            "refill_rounds": float(self.rounds),
            "refill_groups": float(self.num_groups),
            "refill_fill_frac": self.num_groups / self.target_groups,
            "solve_all_frac": self._solve_all / seen,
            "solve_none_frac": self._solve_none / seen,
        }
