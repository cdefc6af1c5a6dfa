"""Cluster placement of the rewards: one scorer actor per Ray node, fed by the controller by outstanding work.

`ScorerPlane` starts a `or1.scoring.scorer.Scorer` on every alive node with room for it (NodeAffinity, its CPUs
declared to Ray) and runs one dispatch thread. Sessions cut their rows into chunks of one ability; the thread hands
each chunk to the ready scorer with the fewest outstanding rows (at most IN_FLIGHT chunks each: one running, one
queued behind it). Nothing stalls silently:
- a chunk has a bound (its rows x the timeouts, over the scorer's verifier processes) plus reward.scorer_grace,
  counted from when the scorer could start it; a scorer past it is hung: killed, replaced, its chunks sent again;
- a scorer that dies (its node lost) is replaced where its node still lives, its chunks sent again;
- a chunk that failed reward.scoring_retries + 1 times ends its session with one line naming its rows and scorer.
Results are kept per row key, so a row is never counted twice (a late duplicate is dropped).
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from or1.config.schema import RewardConfig
from or1.errors import UserError
from or1.hybrid.actor_pool import Member, RestartBudget, kill, last_line, least_loaded
from or1.rewards.code import PROBLEM_BUDGET
from or1.scoring.scorer import Scorer
from or1.scoring.session import ScoringSession, ability_groups

IN_FLIGHT = 2  # chunks a scorer holds at once: the one it runs and the next, so it never idles
START_TIMEOUT = 180.0  # seconds a new scorer may take to be placed, import and warm a verifier process
MAX_START_FAILURES = 3  # a node whose scorers fail to start this often gets no more
POLL = 0.05  # seconds the dispatch thread waits for a result before it looks at deadlines and new chunks
LOG = logging.getLogger(__name__)


def short_node(node_id: str) -> str:
    """The first 8 hex digits of a Ray node id: how metrics and messages name a node."""
    return node_id[:8]


def _why(error: BaseException) -> str:
    return last_line(error)[:200]


@dataclass(eq=False)
class _Chunk:
    session: ClusterSession
    keys: list[Hashable]
    rows: list[dict]
    ability: str
    bound: float  # seconds the chunk may take on a scorer, grace excluded
    failures: list[str] = field(default_factory=list)  # "<scorer>: <why>", one per failed attempt
    sent: float = 0.0  # when it was last sent to a scorer

    def __len__(self) -> int:  # its weight in a scorer's outstanding work
        return len(self.keys)


@dataclass(eq=False)
class _Scorer(Member):
    """A member of the plane (its `inflight`: result ref -> chunk, in send order), pinned to `node`."""

    node: str = field(default="", kw_only=True)
    name: str = field(default="", kw_only=True)
    created: float = field(default=0.0, kw_only=True)
    ready_ref: Any | None = field(default=None, kw_only=True)  # None once the scorer is ready
    clock: float = field(
        default=0.0, kw_only=True
    )  # when its last chunk came back: a queued one counts from then


class ClusterSession(ScoringSession):
    """A scoring session whose rows go to the plane's scorers, in chunks of one ability."""

    def __init__(self, plane: ScorerPlane) -> None:
        super().__init__()
        self._plane = plane
        self._error: str | None = None

    def _start(self, keys: list[Hashable], rows: list[dict]) -> None:
        self._plane.enqueue(self._plane.chunks(self, keys, rows))

    def _wait(self) -> None:
        with self._lock:
            while not self._all_scored() and self._error is None:
                self._lock.wait(1.0)
            error = self._error
        if error is not None:
            self._plane.cancel(self)
            raise UserError(error)

    def fail(self, message: str) -> None:
        """End the session: finish() raises `message` (the first one wins)."""
        with self._lock:
            if self._error is None:
                self._error = message
            self._lock.notify_all()

    @property
    def failed(self) -> bool:
        return self._error is not None


class ScorerPlane:
    """The cluster's scorers and the thread that feeds them (see the module docstring)."""

    def __init__(self, config: RewardConfig, scorer_cls: type | None = None) -> None:
        if not ray.is_initialized():
            raise UserError(
                "reward.placement=cluster needs Ray connected (or1 train starts it); use placement head"
            )
        self.cfg = config
        self.cpus = config.scorer_cpus or float(config.workers)
        self._remote = ray.remote(scorer_cls or Scorer)
        self._scorers: list[_Scorer] = []
        self._pending: deque[_Chunk] = deque()
        self._start_failures = RestartBudget(MAX_START_FAILURES, per_key=True)  # starts that failed, per node
        self._seq = itertools.count(1)
        self._starved_since: float | None = None
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._closed = False
        self._ensure_scorers()
        if not self._scorers:
            raise UserError(
                f"reward.placement=cluster: no Ray node has the {self.cpus:g} CPUs a scorer declares "
                "(reward.scorer_cpus, else reward.workers); lower it or use reward.placement=head"
            )
        self._thread = threading.Thread(target=self._run, name="or1-scoring", daemon=True)
        self._thread.start()

    # --- what sessions call -------------------------------------------------------------------------------------

    def chunks(self, session: ClusterSession, keys: list[Hashable], rows: list[dict]) -> list[_Chunk]:
        """The rows cut into chunks of one ability, 2 x reward.workers rows each, with their time bounds."""
        workers, size = self.cfg.workers, 2 * self.cfg.workers
        out = []
        for ability, (group_keys, group_rows) in ability_groups(keys, rows).items():
            per_row = (
                max(PROBLEM_BUDGET, self.cfg.code_timeout) if ability == "code" else self.cfg.math_timeout
            )
            for i in range(0, len(group_keys), size):
                part = group_keys[i : i + size]
                bound = math.ceil(len(part) / workers) * per_row
                out.append(_Chunk(session, part, group_rows[i : i + size], ability, bound))
        return out

    def enqueue(self, chunks: list[_Chunk]) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("the reward manager is closed")
            self._pending.extend(chunks)
        self._wake.set()

    def cancel(self, session: ClusterSession) -> None:
        """Drop a failed session's chunks that wait for a scorer (those in flight are ignored when they return)."""
        with self._lock:
            self._pending = deque(c for c in self._pending if c.session is not session)

    def add_new_nodes(self) -> None:
        """Start scorers on nodes that joined since (and where a lost one can be replaced now)."""
        with self._lock:
            if not self._closed:
                self._ensure_scorers()

    def node_scorers(self) -> dict[str, int]:
        """Ready scorers per node (short id)."""
        with self._lock:
            return dict(Counter(short_node(s.node) for s in self._scorers if s.ready_ref is None))

    def close(self) -> None:
        """Stop the dispatch thread and kill every scorer (their verifier processes die with them)."""
        with self._lock:
            self._closed = True
        self._wake.set()
        self._thread.join(10)
        with self._lock:
            for session in self._sessions():
                session.fail("the reward manager was closed before these rows were scored")
            for scorer in self._scorers:
                kill(scorer)
            self._scorers, self._pending = [], deque()

    # --- the dispatch thread ------------------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closed:
                self._turn()
        except BaseException as err:  # a bug here must not leave finish() waiting forever
            with self._lock:
                for session in self._sessions():
                    session.fail(f"the scoring thread failed: {type(err).__name__}: {err}")
            raise

    def _sessions(self) -> set[ClusterSession]:
        """The sessions with chunks waiting or in flight."""
        return {c.session for c in self._pending} | {
            c.session for s in self._scorers for c in s.inflight.values()
        }

    def _turn(self) -> None:
        with self._lock:
            self._dispatch()
            refs = [s.ready_ref for s in self._scorers if s.ready_ref is not None]
            refs += [ref for s in self._scorers for ref in s.inflight]
        if refs:
            done, _ = ray.wait(refs, num_returns=1, timeout=POLL)
            if done:
                done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        else:
            self._wake.wait(1.0)
            self._wake.clear()
            done = []
        with self._lock:
            for ref in done:
                self._collect(ref)
            self._expire()

    def _dispatch(self) -> None:
        """Hand pending chunks to ready scorers, each to the one with the fewest outstanding rows."""
        now = time.monotonic()
        while self._pending:
            scorer = least_loaded((s for s in self._scorers if s.ready_ref is None), IN_FLIGHT)
            if scorer is None:
                break
            chunk = self._pending.popleft()
            if chunk.session.failed:
                continue
            chunk.sent = now
            scorer.inflight[scorer.handle.score.remote(chunk.rows)] = chunk

    def _collect(self, ref: Any) -> None:
        for scorer in list(self._scorers):
            if scorer.ready_ref is not None and scorer.ready_ref == ref:
                try:
                    ray.get(ref)
                except RayError as err:
                    self._lose(scorer, f"did not start ({_why(err)})")
                    return
                scorer.ready_ref, scorer.clock = None, time.monotonic()
                return
            if ref in scorer.inflight:
                self._chunk_done(scorer, ref)
                return

    def _chunk_done(self, scorer: _Scorer, ref: Any) -> None:
        chunk = scorer.inflight[ref]
        try:
            answer = ray.get(ref)
        except RayTaskError as err:  # the scorer raised on this chunk: the chunk failed, the scorer lives on
            del scorer.inflight[ref]
            scorer.clock = time.monotonic()
            chunk.failures.append(f"{scorer.name}: {_why(err)}")
            self._retry(chunk)
            return
        except RayError as err:  # the actor is gone (its node lost, or it crashed)
            self._lose(scorer, f"died ({type(err).__name__})")
            return
        del scorer.inflight[ref]
        scorer.clock = time.monotonic()
        chunk.session._record(
            chunk.keys, answer.results, short_node(answer.node), chunk.ability, answer.seconds
        )

    def _expire(self) -> None:
        """Scorers past a deadline are lost; chunks with no scorer to go to for START_TIMEOUT fail."""
        now = time.monotonic()
        for scorer in list(self._scorers):
            if scorer.ready_ref is not None:
                if now - scorer.created > START_TIMEOUT:
                    self._lose(scorer, f"did not start within {START_TIMEOUT:.0f} s")
            elif scorer.inflight:
                chunk = next(iter(scorer.inflight.values()))  # the one it runs; the next waits behind it
                limit = chunk.bound + self.cfg.scorer_grace
                if now - max(chunk.sent, scorer.clock) > limit:
                    self._lose(scorer, f"no answer within {limit:.0f} s")
        ready = any(s.ready_ref is None for s in self._scorers)
        if not self._pending or ready:
            self._starved_since = None
            return
        self._starved_since = self._starved_since or now
        if not self._scorers or now - self._starved_since > START_TIMEOUT:
            why = "no scorer is running" if not self._scorers else "no scorer became ready"
            while self._pending:
                chunk = self._pending.popleft()
                chunk.session.fail(_cannot_finish(chunk, f"{why} (each declares {self.cpus:g} CPUs)"))

    def _lose(self, scorer: _Scorer, why: str) -> None:
        """Kill `scorer`, send its chunks again (the one it was running counts a failure), start its replacement."""
        self._scorers.remove(scorer)
        kill(scorer)
        if scorer.ready_ref is not None:
            self._start_failures.spend(scorer.node)
        chunks = list(scorer.inflight.values())
        LOG.warning(
            "%s lost: %s; its %d outstanding rows go to another scorer", scorer.name, why, scorer.outstanding
        )
        for chunk in reversed(chunks[1:]):
            if not chunk.session.failed:
                self._pending.appendleft(chunk)
        if chunks:
            chunks[0].failures.append(f"{scorer.name}: {why}")
            self._retry(chunks[0])
        self._ensure_scorers()

    def _retry(self, chunk: _Chunk) -> None:
        if chunk.session.failed:
            return
        if len(chunk.failures) > self.cfg.scoring_retries:
            chunk.session.fail(_cannot_finish(chunk, chunk.failures[-1]))
        else:
            self._pending.appendleft(chunk)

    def _ensure_scorers(self) -> None:
        """A scorer on every alive node with room for one that has none (and has not failed to start too often)."""
        have = {s.node for s in self._scorers}
        for node in ray.nodes():
            node_id = node["NodeID"]
            if (
                not node.get("Alive")
                or node_id in have
                or node.get("Resources", {}).get("CPU", 0) < self.cpus
            ):
                continue
            if not self._start_failures.allows(node_id):
                continue
            handle = self._remote.options(
                num_cpus=self.cpus, scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
            ).remote(self.cfg)
            seq = next(self._seq)
            self._scorers.append(
                _Scorer(
                    seq,
                    handle,
                    node=node_id,
                    name=f"scorer {short_node(node_id)}#{seq}",
                    created=time.monotonic(),
                    ready_ref=handle.ready.remote(),
                )
            )


def _cannot_finish(chunk: _Chunk, why: str) -> str:
    """One line: which rows could not be scored, by which scorer, why, and what to change."""
    keys = ", ".join(map(str, chunk.keys[:8])) + (
        f" and {len(chunk.keys) - 8} more" if len(chunk.keys) > 8 else ""
    )
    tries = len(chunk.failures)
    what = f"failed {tries} time{'s' * (tries != 1)}, last on {why}" if tries else f"found no scorer: {why}"
    return (
        f"scoring could not finish: {chunk.ability} rows {keys} {what}; check that node, or raise "
        "reward.scorer_grace or reward.scoring_retries"
    )
