"""The training loop's reward: scores decoded responses with or1's verifiers, on the head or on the cluster.

`RewardManager.session()` opens a scoring session (or1.scoring.session): rows go in as they are ready, scores come
out at `finish()`. reward.placement head scores in the controller's process: `or1.rewards.score.score_batch` runs
the verifiers in a persistent pool of killable processes with hard time limits (code inside the sandbox), on a
background thread, so scoring overlaps whatever the controller does meanwhile. verl and Skywork-OR1 score
rule-based rewards in the driver with a process pool too. reward.placement cluster spreads the rows over one scorer
actor per Ray node (or1.scoring.cluster_placement), each with its own verifier processes and sandbox.

`compute_scores` reads non-tensor columns `ability`, `response_text`, `reward_model`; writes `scores` [B] (float),
the non-tensor `score_reason`, `score_seconds` and `score_node`, with the seconds each ability's verifier took in
the meta (`reward_seconds`: {"math": s, "code": s}).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from or1.config.schema import RewardConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    REWARD_COLUMNS,
    REWARD_HIDDEN,
    REWARD_SECONDS,
    SCORE_NODE,
    SCORE_REASON,
    SCORE_SECONDS,
    SCORES,
    reward_input,
)
from or1.rewards.score import math_pool
from or1.scoring.session import HEAD_NODE, HeadSession, Scored, ScoringSession, row_seconds


def hidden_seconds(scored: Scored) -> float:
    """Scoring time that ran while the caller did something else: the scoring's wall time (its span, or the
    verifiers' summed seconds when those are less: idle gaps between streamed rows are not scoring) minus the time
    the caller waited in finish()."""
    working = min(scored.busy_seconds, sum(scored.ability_seconds.values()))
    return max(0.0, working - scored.exposed_seconds)


class RewardManager:
    """The verifiers' front-end. Head placement: their processes are shared by the whole controller and stop when
    it exits; cluster placement: one scorer actor per node, stopped by `close()`.

    `scorer_cls` (cluster placement) is the scorer actor's class, `or1.scoring.scorer.Scorer` unless a test gives
    its own.
    """

    def __init__(self, config: RewardConfig, *, scorer_cls: type | None = None):
        self.cfg = config
        self._plane = None
        self._executor: ThreadPoolExecutor | None = None
        if config.placement == "cluster":
            from or1.scoring.cluster_placement import ScorerPlane  # imports Ray: only for cluster placement

            self._plane = ScorerPlane(config, scorer_cls)
        else:
            # The verifier processes import and warm up now, while the actor ranks load their models, so the first
            # scoring (step 0's validation) does not wait for them.
            math_pool(config.workers).start()
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="or1-scoring")

    def session(self) -> ScoringSession:
        """A new scoring session (one per batch): `submit` rows as they are ready, `finish` for every score."""
        if self._plane is not None:
            from or1.scoring.cluster_placement import ClusterSession

            self._plane.add_new_nodes()
            return ClusterSession(self._plane)
        assert self._executor is not None
        return HeadSession(self.cfg, self._executor)

    def scorers(self) -> dict[str, int]:
        """Ready scorer actors per node (short id) under cluster placement; {"head": 1} under head placement."""
        return self._plane.node_scorers() if self._plane is not None else {HEAD_NODE: 1}

    def compute_scores(self, batch: Batch, session: ScoringSession | None = None) -> Batch:
        """One score per response (1.0 / 0.0 for math) and the verifier's one-word reason; each ability's rows are
        scored apart so the step can report what each costs (code: its sandbox seconds).

        `session`: one the rows were already streamed into, keyed by their row in `batch` (generation submits each
        row as it finishes); the rows it has not seen are submitted now. The meta then also says how much of the
        scoring ran while the caller did something else (REWARD_HIDDEN) and how long the caller waited for it.
        """
        rows = [reward_input(*row) for row in zip(*(batch[c] for c in REWARD_COLUMNS), strict=True)]
        session = session or self.session()
        seen = session.submitted
        unseen = [i for i in range(len(rows)) if i not in seen]
        session.submit(unseen, [rows[i] for i in unseen])
        scored = session.finish()
        results = [scored.results[i] for i in range(len(rows))]
        return Batch(
            {SCORES: torch.tensor([r.score for r in results], dtype=torch.float32)},
            {
                SCORE_REASON: [r.reason for r in results],
                SCORE_SECONDS: [row_seconds(r) for r in results],
                SCORE_NODE: [scored.nodes[i] for i in range(len(rows))],
            },
            {
                REWARD_SECONDS: scored.ability_seconds,
                REWARD_HIDDEN: hidden_seconds(scored),
            },
        )

    def close(self) -> None:
        """Stop the scorer actors (cluster placement) and the scoring thread; the manager cannot score afterwards."""
        if self._plane is not None:
            self._plane.close()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
