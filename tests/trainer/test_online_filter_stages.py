"""Online filtering across stages: a prompt solved every time in any earlier stage stays out of later stages."""

from pathlib import Path

import pandas as pd
from rich.console import Console

from or1.algos.online_filter import PromptStats
from or1.config.recipe import resolve
from or1.data.records import prompt_key
from or1.layout import PROMPT_STATS_FILE
from or1.trainer.stage_start import filtered_prompts


def _rows(n: int) -> list[dict]:
    return [
        {
            "data_source": "t",
            "prompt": [{"role": "user", "content": f"Compute {i}+1."}],
            "ability": "math",
            "reward_model": {"ground_truth": f'["{i + 1}"]', "style": "rule"},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def _stats(stage_dir: Path, solved: dict[str, tuple[int, int]]) -> None:
    stats = PromptStats()
    for uid, (attempts, ok) in solved.items():
        stats.update([uid] * attempts, [1.0] * ok + [0.0] * (attempts - ok))
    stage_dir.mkdir(parents=True)
    stats.save(stage_dir / PROMPT_STATS_FILE)


def test_stage3_drops_what_stage1_or_stage2_always_solved(tmp_path):
    rows = _rows(4)
    data = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    keys = [prompt_key(r) for r in rows]
    run = tmp_path / "run"
    _stats(run / "stage1", {keys[0]: (8, 8), keys[1]: (8, 7), keys[2]: (8, 0)})  # prompt 0 solved every time
    _stats(run / "stage2", {keys[1]: (8, 8), keys[2]: (8, 3)})  # prompt 1 solved every time; 0 not sampled
    recipe = Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml"
    overrides = [f"data.train_files=[{data}]"]
    quiet = Console(file=open("/dev/null", "w"))
    stage2 = filtered_prompts(resolve(str(recipe), 2, overrides), run / "stage2", quiet)
    assert stage2 == (set(keys[1:]), {"stage1": 1})
    stage3 = filtered_prompts(resolve(str(recipe), 3, overrides), run / "stage3", quiet)
    assert stage3 == ({keys[2], keys[3]}, {"stage1": 1, "stage2": 1})
    off = resolve(str(recipe), 3, [*overrides, "algorithm.online_filter=false"])
    assert filtered_prompts(off, run / "stage3", quiet) == (None, {})
