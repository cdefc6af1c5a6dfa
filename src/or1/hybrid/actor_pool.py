"""Replaceable actors that work is dealt to: the scheduling that the scoring plane (`or1.scoring.cluster_placement`),
the eval replicas (`or1.eval.replicas`) and the separate placement's rollout replicas (`or1.trainer.separate`) share.

It has no thread of its own; each owner calls it from its own loop. A `Member` is one actor (or an engine in the
owner's process) with the chunks of work it holds, keyed by the ticket its result comes back on (a Ray ref or a
future), in the order they were sent. `least_loaded` deals: the member with room for another chunk and the least
work outstanding, so one that drew slow work gets less rather than everyone waiting for it. `first_results` lets the
first result for a position win (a copy sent to another member, or resent after a death, that comes back later is
dropped). `replace` swaps a dead member for one started in its place, under the owner's `RestartBudget`, and hands
back the work it held. `last_line` is how a remote failure is named in one line.

What is an owner's own stays with it: the scoring plane's node affinity and deadlines, the eval replicas' layout,
backup copies and the replica in the owner's process, the separate placement's weight versions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sized
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, TypeVar

import ray


def last_line(error: BaseException | str) -> str:
    """The last line of a (remote) traceback: the exception that ended it; its type when it printed nothing."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if lines:
        return lines[-1]
    return type(error).__name__ if isinstance(error, BaseException) else "unknown error"


class RestartBudget:
    """How many replacements an owner may start: `limit` in all, or `limit` per key (a node) with `per_key`."""

    def __init__(self, limit: int, *, per_key: bool = False) -> None:
        self.limit, self.per_key = limit, per_key
        self.spent: Counter[Hashable] = Counter()

    def allows(self, key: Hashable = None) -> bool:
        """Whether one more replacement (for `key`) is within the budget."""
        return self.spent[key if self.per_key else None] < self.limit

    def spend(self, key: Hashable = None) -> bool:
        """Count one replacement (for `key`); whether it was within the budget."""
        allowed = self.allows(key)
        self.spent[key if self.per_key else None] += 1
        return allowed

    @property
    def used(self) -> int:
        return sum(self.spent.values())


@dataclass(eq=False)
class Member:
    """One actor of a pool and the chunks it holds (ticket -> work, in send order); `handle` None for an engine in
    the owner's own process."""

    index: int
    handle: Any = None
    inflight: dict[Any, Sized] = field(default_factory=dict)

    @property
    def outstanding(self) -> int:
        """The work it holds: the positions of its chunks."""
        return sum(len(work) for work in self.inflight.values())


M = TypeVar("M", bound=Member)


def least_loaded(members: Iterable[M], depth: int) -> M | None:
    """The member with room (fewer than `depth` chunks) and the least work outstanding (the lowest index on a tie);
    None when every member is full."""
    room = [m for m in members if len(m.inflight) < depth]
    return min(room, key=lambda m: (m.outstanding, m.index)) if room else None


def first_results(positions: Iterable[Hashable], done: set[Hashable]) -> list[Hashable]:
    """The positions whose result this is the first of, now marked done (later copies find them there)."""
    fresh = [p for p in positions if p not in done]
    done.update(fresh)
    return fresh


def kill(member: Member) -> None:
    """Kill a member's actor for good; one already gone is no error."""
    if member.handle is not None:
        with suppress(Exception):
            ray.kill(member.handle, no_restart=True)


def replace(
    members: list[M], member: M, start: Callable[[int], M], budget: RestartBudget, what: str
) -> list[Sized]:
    """Kill `member` (dead or hung), start another in its place and return the work it held; a RuntimeError once
    `budget` is spent."""
    if not budget.spend():
        raise RuntimeError(f"{what} died {budget.used} times; giving up (see the Ray logs)")
    kill(member)
    members[members.index(member)] = start(member.index)
    return list(member.inflight.values())
