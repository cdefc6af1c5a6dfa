"""The reward worker: scores a Batch of decoded responses with or1's verifiers, outside the training processes.

It runs in its own Ray actor(s); inside, `or1.rewards.score.score_batch` fans the rows out to a persistent pool of
killable verifier processes with hard time limits, so a pathological answer can stall neither a rank nor the
controller. Reads non-tensor columns `ability`, `response_text`, `reward_model`; writes `scores` [B] (float) and
the non-tensor `score_reason`.
"""

from __future__ import annotations

import torch

from or1.config.schema import RewardConfig
from or1.hybrid.batch import Batch
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.worker import Worker
from or1.rewards.score import close_pools, math_pool, score_batch

REWARD_COLUMNS = ("ability", "response_text", "reward_model")


class RewardWorker(Worker):
    """Verifier front-end of one reward rank (no model, no torch.distributed)."""

    def __init__(self, config: RewardConfig):
        self.cfg = config
        # The verifier processes import and warm up now, while the actor ranks load their models, so the first
        # scoring (step 0's validation) does not wait for them.
        math_pool(config.workers).start()

    @register(Dispatch.DP_COMPUTE)
    def compute_scores(self, batch: Batch) -> Batch:
        """One score per response (1.0 / 0.0 for math) and the verifier's one-word reason."""
        rows = [
            {"ability": ability, "response": text, "reward_model": reward_model}
            for ability, text, reward_model in zip(*(batch[c] for c in REWARD_COLUMNS), strict=True)
        ]
        results = score_batch(
            rows,
            workers=self.cfg.workers,
            timeout=self.cfg.math_timeout,
            code_timeout=self.cfg.code_timeout,
            math_extraction=self.cfg.math_extraction,
        )
        scores = torch.tensor([r.score for r in results], dtype=torch.float32)
        return Batch({"scores": scores}, {"score_reason": [r.reason for r in results]})

    @register(Dispatch.ONE_TO_ALL)
    def close(self) -> None:
        """Stop the verifier processes (they also stop when the actor exits)."""
        close_pools()
