"""The controller's RewardManager on a mixed batch: each row by its own verifier, each ability's seconds apart."""

from __future__ import annotations

from or1.config.schema import RewardConfig
from or1.data.synthetic import code_validation_rows, math_validation_rows
from or1.hybrid.batch import Batch
from or1.hybrid.columns import REWARD_SECONDS
from or1.scoring import RewardManager


def test_mixed_rows_are_scored_by_their_own_verifier_and_timed_apart() -> None:
    math, code = math_validation_rows()[:2], code_validation_rows()[:2]
    responses = [
        math[0]["extra_info"]["solution"],  # right
        "\\boxed{1000}",  # wrong
        f"```python\n{code[0]['extra_info']['reference_solution']}```",  # passes its tests
        "```python\nprint(1000)\n```",  # wrong output
    ]
    rows = [*math, *code]
    batch = Batch.from_dict(
        {
            "ability": [r["ability"] for r in rows],
            "response_text": responses,
            "reward_model": [dict(r["reward_model"]) for r in rows],
        }
    )
    scored = RewardManager(RewardConfig(workers=1)).compute_scores(batch)
    assert scored.tensors["scores"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert list(scored.non_tensor["score_reason"]) == ["correct", "wrong_answer", "correct", "wrong_output"]
    seconds = scored.meta[REWARD_SECONDS]
    assert set(seconds) == {"math", "code"} and all(s > 0 for s in seconds.values())
