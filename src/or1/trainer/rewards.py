"""The training loop's reward: scores a Batch of decoded responses with or1's verifiers, from the controller.

`RewardManager.compute_scores` hands the rows to `or1.rewards.score.score_batch`, which runs the verifiers in a
persistent pool of killable processes with hard time limits (code inside the sandbox), so a pathological answer
stalls neither the controller nor a rank. verl and Skywork-OR1 score rule-based rewards in the driver with a process
pool too. (or1 first gave this front-end a Ray actor of its own: a process that imported Ray and torch only to
forward rows to the same pool, about 6 CPU-seconds of the tiny recipe's start-up.)

Reads non-tensor columns `ability`, `response_text`, `reward_model`; writes `scores` [B] (float) and the non-tensor
`score_reason`, with the seconds each ability's verifier took in the meta (`reward_seconds`: {"math": s, "code": s}).
"""

from __future__ import annotations

import time

import torch

from or1.config.schema import RewardConfig
from or1.hybrid.batch import Batch
from or1.hybrid.columns import REWARD_COLUMNS, REWARD_SECONDS, SCORE_REASON, SCORES
from or1.rewards.score import math_pool, score_batch


class RewardManager:
    """The verifiers' front-end; their processes are shared by the whole controller and stop when it exits."""

    def __init__(self, config: RewardConfig):
        self.cfg = config
        # The verifier processes import and warm up now, while the actor ranks load their models, so the first
        # scoring (step 0's validation) does not wait for them.
        math_pool(config.workers).start()

    def compute_scores(self, batch: Batch) -> Batch:
        """One score per response (1.0 / 0.0 for math) and the verifier's one-word reason; each ability's rows are
        scored apart so the step can report what each costs (code: its sandbox seconds)."""
        rows = [
            {"ability": ability, "response": text, "reward_model": reward_model}
            for ability, text, reward_model in zip(*(batch[c] for c in REWARD_COLUMNS), strict=True)
        ]
        scores, reasons = [0.0] * len(rows), [""] * len(rows)
        seconds: dict[str, float] = {}
        for ability in sorted({row["ability"] for row in rows}):
            indices = [i for i, row in enumerate(rows) if row["ability"] == ability]
            start = time.perf_counter()
            results = score_batch(
                [rows[i] for i in indices],
                workers=self.cfg.workers,
                timeout=self.cfg.math_timeout,
                code_timeout=self.cfg.code_timeout,
                math_extraction=self.cfg.math_extraction,
            )
            seconds[str(ability)] = time.perf_counter() - start
            for i, result in zip(indices, results, strict=True):
                scores[i], reasons[i] = result.score, result.reason
        return Batch(
            {SCORES: torch.tensor(scores, dtype=torch.float32)},
            {SCORE_REASON: reasons},
            {REWARD_SECONDS: seconds},
        )
