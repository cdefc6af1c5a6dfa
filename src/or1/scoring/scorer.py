"""One reward scorer per Ray node: scores chunks of rows with that node's own verifier processes and sandbox.

The controller's scorer plane (`or1.scoring.cluster_placement`) starts one `Scorer` actor on every node when
reward.placement is cluster, declaring its CPUs to Ray, and feeds it chunks of rows of one ability. The actor scores
with the same `or1.scoring.session.timed_scores` as head placement, so a row scores the same wherever it is scored;
its verifier pools are process-wide in the actor and die with it. Chunks run one at a time (the pools run one batch
at a time).
"""

from __future__ import annotations

from dataclasses import dataclass

import ray

from or1.config.schema import RewardConfig
from or1.rewards.result import Result
from or1.rewards.score import math_pool
from or1.scoring.session import timed_scores


@dataclass(frozen=True)
class ChunkScores:
    """A scorer's answer for one chunk: one Result per row in order, its node and the chunk's wall seconds."""

    node: str
    results: list[Result]
    seconds: float


class Scorer:
    """The body of a scorer actor (the controller wraps it with `ray.remote`); rows as in `score_batch`."""

    def __init__(self, config: RewardConfig) -> None:
        self.cfg = config
        self.node = ray.get_runtime_context().get_node_id()
        math_pool(config.workers).start()  # the verifier processes warm up while the actor is created

    def ready(self) -> str:
        """Returns this node's id once a verifier process is warm (the controller then starts its deadlines)."""
        math_pool(self.cfg.workers).map(abs, [(0,)], timeout=60.0)
        return self.node

    def score(self, rows: list[dict]) -> ChunkScores:
        """Score one chunk of rows ({"ability", "response", "reward_model"})."""
        results, seconds = timed_scores(rows, self.cfg)
        return ChunkScores(self.node, results, seconds)
