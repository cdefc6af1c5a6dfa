"""What a stage starts from: stage N > 1 starts from stage N-1's final model (checked in
`or1.preflight.check_runnable`) and final critic, and trains only on the prompts no earlier stage always solved
(algorithm.online_filter, from each stage's prompt_stats.parquet)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from or1.algos.online_filter import PromptStats, online_filter
from or1.config.schema import RunConfig
from or1.data.records import prompt_key
from or1.data.rows import read_rows
from or1.errors import UserError
from or1.layout import PROMPT_STATS_FILE, finished_critic, stage_directory


@dataclass(frozen=True)
class StageStart:
    """What one stage starts from: its resolved config, its folder, and the model (and critic) it loads."""

    cfg: RunConfig
    stage_dir: Path
    model_path: str
    critic_path: str | None  # GAE only: the critic's start folder


def critic_start(cfg: RunConfig, run_dir: Path, model_path: str) -> str:
    """The critic's start folder: stage N-1's final critic, else critic.model_path, else the stage's start policy."""
    previous = finished_critic(run_dir, cfg.stage.index - 1) if cfg.stage.index > 1 else None
    if previous is not None:
        return str(previous)
    path = cfg.critic.model_path or model_path
    if not Path(path).is_dir():
        raise UserError(f"critic.model_path: {path} is not a model folder (relative to {Path.cwd()})")
    return path


def filtered_prompts(
    cfg: RunConfig, stage_dir: Path, console: Console
) -> tuple[set[str] | None, dict[str, int]]:
    """Prompt keys kept after online filtering (None: no filter) and the count each earlier stage dropped.

    A prompt solved every time in any earlier stage stays dropped.
    """
    if cfg.stage.index == 1 or not cfg.algorithm.online_filter:
        return None, {}
    dropped = {}
    kept = [prompt_key(row) for f in cfg.data.train_files for row in read_rows(f)]
    total = len(kept)
    for earlier in range(1, cfg.stage.index):
        stats = PromptStats.load(stage_directory(stage_dir.parent, earlier) / PROMPT_STATS_FILE)
        kept, report = online_filter(kept, stats, cfg.algorithm.online_filter_threshold)
        dropped[f"stage{earlier}"] = report.dropped
        console.print(
            f"online filter: dropped {report.dropped} prompts solved every time in stage {earlier} "
            f"(threshold {report.threshold:g})"
        )
    console.print(f"online filter: {len(kept)} of {total} prompts left for stage {cfg.stage.index}")
    return set(kept), dropped
