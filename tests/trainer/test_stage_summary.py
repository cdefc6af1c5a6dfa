"""The stage summary from a hand-written metrics file: curves over trained steps, validation start -> end, counts."""

import json
from pathlib import Path

from or1.algos.online_filter import PromptStats
from or1.config.schema import TrainerConfig
from or1.trainer.summary import stage_summary, summary_lines

VAL = "val/validation/t1/avg@5"


def test_summary_of_a_stage_with_a_skipped_step(tmp_path: Path) -> None:
    rows = [
        {"step": 0, VAL: 0.4},  # validation before training: not a trained step
        {"step": 1, "batch/sampled": 8, "reward/mean": 0.25, "batch/rejected_frac": 0.5, "entropy/coef": 0.0},
        {"step": 2, "batch/sampled": 8, "skipped": 1.0, "reward/mean": 0.0, "batch/rejected_frac": 1.0},
        {
            "step": 3,
            "batch/sampled": 8,
            "reward/mean": 0.75,
            "batch/rejected_frac": 0.0,
            "entropy/coef": 0.002,
            VAL: 0.55,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    stats = PromptStats()
    stats.update(["a", "a", "b", "b", "c"], [1.0, 1.0, 0.0, 0.0, 1.0])
    summary = stage_summary(tmp_path, {"stage": 2}, stats, TrainerConfig())
    assert summary["stage"] == 2 and summary["steps"] == 3 and summary["skipped_steps"] == 1
    assert summary["curves"]["reward/mean"] == {
        "first": 0.25,
        "last": 0.75,
        "mean": 1 / 3,
        "min": 0.0,
        "max": 0.75,
    }
    assert summary["curves"]["entropy/coef"]["last"] == 0.002  # the skipped step logged no coefficient
    assert summary["validation"][VAL] == {"start": 0.4, "start_step": 0, "end": 0.55, "end_step": 3}
    assert (
        summary["prompts_sampled"],
        summary["prompts_always_solved"],
        summary["prompts_never_solved"],
    ) == (3, 2, 1)
    lines = summary_lines(summary)
    assert "3 steps (1 skipped)" in lines[0]
    assert "rejected groups 50% on average" in lines[1] and "0.0000 -> 0.0020" in lines[1]
    assert lines[2].endswith("40.0% (step 0) -> 55.0% (step 3)")
