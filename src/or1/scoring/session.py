"""Scoring sessions: rows go in as they are ready (`submit`, non-blocking), every score comes out at `finish`.

One session per batch. The caller submits rows while it does something else (generation streams finished rows
in); `finish` blocks until each submitted row is scored exactly once. `HeadSession` scores in this process on a
background thread (reward.placement head); `or1.scoring.cluster_placement` spreads the rows over one scorer actor
per Ray node (cluster). Both score with `timed_scores` (`or1.rewards.score.score_with`), so a row scores the same
in either.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Hashable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from or1.config.schema import RewardConfig
from or1.rewards.result import Result
from or1.rewards.score import score_with

HEAD_NODE = "head"  # where head placement scores, in Scored.nodes and the per-node metrics
SLOWEST_ROWS = 3  # the slowest rows of a step named in its metrics and kept in its saved samples


def timed_scores(rows: Sequence[dict], config: RewardConfig) -> tuple[list[Result], float]:
    """The rows' Results (`score_with`) and the wall seconds they took: how head placement and every scorer actor
    score one ability's rows (the seconds go into Scored.ability_seconds)."""
    start = time.perf_counter()
    results = score_with(rows, config)
    return results, time.perf_counter() - start


def row_seconds(result: Result) -> float:
    """Wall seconds the verifier spent on the row (0.0 when string work decided it without a verifier)."""
    return float(result.seconds)


def slowest_rows(seconds: Sequence[float], count: int = SLOWEST_ROWS) -> list[int]:
    """Indices of the `count` rows that took longest to score, slowest first (ties: the earlier row); rows decided
    without running a verifier (0 s) are never among them."""
    timed = [i for i in range(len(seconds)) if float(seconds[i]) > 0]
    return sorted(timed, key=lambda i: (-float(seconds[i]), i))[:count]


@dataclass
class Scored:
    """What a session scored: per key the Result and the node that scored it, and how long scoring took.

    busy_seconds: first submit to last result (the scoring's own wall time); exposed_seconds: the time the caller
    spent blocked in finish(); ability_seconds: the verifiers' wall seconds per ability, summed over scorers.
    """

    results: dict[Hashable, Result] = field(default_factory=dict)
    nodes: dict[Hashable, str] = field(default_factory=dict)
    busy_seconds: float = 0.0
    exposed_seconds: float = 0.0
    ability_seconds: dict[str, float] = field(default_factory=dict)

    @property
    def node_rows(self) -> dict[str, int]:
        """Rows scored on each node."""
        return dict(Counter(self.nodes.values()))


class ScoringSession:
    """Rows in (`submit`), scores out (`finish`); subclasses decide where the rows are scored (`_start`)."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._submitted: set[Hashable] = set()
        self._scored = Scored()
        self._first_submit: float | None = None
        self._last_result: float | None = None
        self._finished = False

    def submit(self, keys: Sequence[Hashable], rows: Sequence[dict]) -> None:
        """Non-blocking: rows ({"ability", "response", "reward_model"}) start scoring now, in the background."""
        keys, rows = list(keys), list(rows)
        if len(keys) != len(rows):
            raise ValueError(f"{len(keys)} keys for {len(rows)} rows")
        with self._lock:
            if self._finished:
                raise RuntimeError(
                    "this scoring session has finished; start another with RewardManager.session()"
                )
            again = [k for k in keys if k in self._submitted] + [k for k, n in Counter(keys).items() if n > 1]
            if again:
                raise ValueError(
                    f"rows submitted twice to one scoring session: {sorted(map(str, again))[:5]}"
                )
            self._submitted.update(keys)
            if self._first_submit is None:
                self._first_submit = time.perf_counter()
        if keys:
            self._start(keys, rows)

    @property
    def submitted(self) -> frozenset[Hashable]:
        """The keys submitted so far."""
        with self._lock:
            return frozenset(self._submitted)

    def finish(self) -> Scored:
        """Blocks until every submitted row is scored (or raises a one-line UserError naming rows and scorer)."""
        begin = time.perf_counter()
        with self._lock:
            self._finished = True
        self._wait()
        scored = self._scored
        scored.exposed_seconds = time.perf_counter() - begin
        if self._first_submit is not None and self._last_result is not None:
            scored.busy_seconds = self._last_result - self._first_submit
        return scored

    def _start(self, keys: list[Hashable], rows: list[dict]) -> None:
        raise NotImplementedError

    def _wait(self) -> None:
        raise NotImplementedError

    def _record(
        self, keys: Sequence[Hashable], results: Sequence[Result], node: str, ability: str, seconds: float
    ) -> int:
        """Keep the results of rows not scored yet (a late duplicate is dropped); returns how many were new."""
        with self._lock:
            fresh = [(k, r) for k, r in zip(keys, results, strict=True) if k not in self._scored.results]
            for key, result in fresh:
                self._scored.results[key] = result
                self._scored.nodes[key] = node
            if fresh:
                spent = self._scored.ability_seconds
                spent[ability] = spent.get(ability, 0.0) + seconds
                self._last_result = time.perf_counter()
            self._lock.notify_all()
            return len(fresh)

    def _all_scored(self) -> bool:
        return len(self._scored.results) == len(self._submitted)


def ability_groups(keys: list[Hashable], rows: list[dict]) -> dict[str, tuple[list[Hashable], list[dict]]]:
    """The rows split by ability, each ability's keys and rows in order (rows of no known ability together)."""
    groups: dict[str, tuple[list[Hashable], list[dict]]] = {}
    for key, row in zip(keys, rows, strict=True):
        ability = row.get("ability") if isinstance(row, dict) else None
        group = groups.setdefault(str(ability), ([], []))
        group[0].append(key)
        group[1].append(row)
    return groups


class HeadSession(ScoringSession):
    """Scores in this process: each submit's rows, one ability at a time, on the manager's scoring thread."""

    def __init__(self, config: RewardConfig, executor: ThreadPoolExecutor) -> None:
        super().__init__()
        self.cfg, self._executor = config, executor
        self._futures: list[Future[None]] = []

    def _start(self, keys: list[Hashable], rows: list[dict]) -> None:
        for ability, (group_keys, group_rows) in ability_groups(keys, rows).items():
            self._futures.append(self._executor.submit(self._score, ability, group_keys, group_rows))

    def _score(self, ability: str, keys: list[Hashable], rows: list[dict]) -> None:
        results, seconds = timed_scores(rows, self.cfg)
        self._record(keys, results, HEAD_NODE, ability, seconds)

    def _wait(self) -> None:
        for future in self._futures:
            future.result()  # a verifier bug stays loud
