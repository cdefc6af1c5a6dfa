"""Per-step metrics: metrics.jsonl (one JSON object per step), TensorBoard scalars, W&B (optional), a one-line
progress print per step under a progress bar with the stage's ETA, and a few sampled responses per step in
samples/step_<N>.jsonl.

On resume the jsonl is cut back to the checkpoint's step, so a killed-and-resumed run leaves the same file as an
uninterrupted one (apart from timings).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    DATA_SOURCE,
    POLICY_VERSION,
    PROMPT_KEY,
    RESPONSE_TEXT,
    REWARD_MODEL,
    SCORE_NODE,
    SCORE_REASON,
    SCORE_SECONDS,
    SCORES,
)
from or1.layout import METRICS_FILE, SAMPLES_DIR, TENSORBOARD_DIR
from or1.preflight import require_wandb
from or1.run_metrics import (
    STALENESS_MAX,
    STEP,
    STEP_SECONDS,
    VALIDATION_PREFIX,
    is_training_step,
    is_validation_accuracy,
    phase_seconds,
    read_metrics,
)
from or1.scoring import slowest_rows


class PhaseTimer:
    """Wall time of each phase of one step: `with timer("generate"): ...`; `timer.metrics()` -> time/<phase>.
    `generated` holds each generated row's (prompt + response, response) tokens, every sampling round's, for the
    generation's rate and FLOPs."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.generated: list[tuple[int, int]] = []

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, time.perf_counter() - begin)

    def add(self, phase: str, seconds: float) -> None:
        """Count `seconds` measured elsewhere (a verifier's share of the reward phase) under `phase`."""
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds

    def metrics(self) -> dict[str, float]:
        out = {phase_seconds(k): v for k, v in self.seconds.items()}
        out[STEP_SECONDS] = time.perf_counter() - self.start
        return out


class MetricsLogger:
    """Writes each step's metrics to the configured sinks (jsonl and tensorboard; wandb when installed)."""

    def __init__(
        self,
        stage_dir: Path,
        loggers: list[str],
        total_steps: int,
        console: Console | None = None,
        wandb_project: str = "or1",
        wandb_run_name: str | None = None,
    ):
        self.stage_dir = stage_dir
        self.path = stage_dir / METRICS_FILE
        self.total_steps = total_steps
        self.console = console or Console()
        self.use_jsonl = "jsonl" in loggers
        self.tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(stage_dir / TENSORBOARD_DIR))
            self.console.print(
                f"TensorBoard logs in {stage_dir / TENSORBOARD_DIR} (tensorboard --logdir {stage_dir.parent})",
                markup=False,
                highlight=False,
            )
        self.wandb = None
        if "wandb" in loggers:
            wandb = require_wandb()
            self.wandb = wandb.init(
                project=wandb_project,
                name=wandb_run_name or f"{stage_dir.parent.name}-{stage_dir.name}",
                dir=str(stage_dir),
                resume="allow",
            )
        self.progress: Progress | None = None

    def start_progress(self, done: int) -> None:
        """A progress bar with the stage's ETA below the per-step lines, from step `done` (non-zero on resume)."""
        columns = (
            TextColumn("stage"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
        )
        self.progress = Progress(*columns, console=self.console, transient=True)
        self.task = self.progress.add_task("steps", total=self.total_steps, completed=done)
        self.progress.start()

    def records(self) -> list[dict[str, Any]]:
        """The steps logged to metrics.jsonl so far (none without the jsonl sink)."""
        return read_metrics(self.path)

    def truncate_after(self, step: int) -> None:
        """Drop logged steps beyond `step` (written by a run that died after its last checkpoint, maybe in the
        middle of a line)."""
        if not self.path.is_file():
            return
        kept = [record for record in read_metrics(self.path) if record[STEP] <= step]
        self.path.write_text("".join(json.dumps(record) + "\n" for record in kept))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        record = {"step": step, **metrics}
        if self.use_jsonl:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a") as f:
                f.write(json.dumps(record) + "\n")
        numbers = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if self.tb is not None:
            for key, value in numbers.items():
                self.tb.add_scalar(key, value, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(numbers, step=step)
        line = f"{time.strftime('%H:%M:%S')} {progress_line(step, self.total_steps, metrics)}"
        self.console.print(line, highlight=False, soft_wrap=True, markup=False)
        if self.progress is not None:
            self.progress.update(self.task, completed=step)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def progress_line(step: int, total: int, m: dict[str, Any]) -> str:
    """`step 12/250 reward 0.43 kept 48/128 len 31/52 trunc 2% ent 0.31 coef 0.000 loss 0.012 gn 0.84 lr 1.0e-06
    1.1s (gen 0.4s) 120 tok/s (gen 2360 upd 3100) mfu 1.2%`: the step's response tokens per second of the whole
    step, then of generation and of the update (all devices), and the update's MFU."""
    val = " ".join(
        f"{k.removeprefix(VALIDATION_PREFIX)} {v:.1%}" for k, v in m.items() if is_validation_accuracy(k)
    )
    if not is_training_step(m):  # a validation-only record (step 0)
        return f"step {step}/{total} validation: {val}"
    if m.get("skipped"):
        line = f"step {step}/{total} skipped: no group with reward variance (reward {m.get('reward/mean', 0):.2f})"
        return f"{line} | validation: {val}" if val else line

    def get(key: str) -> float:
        return float(m.get(key, float("nan")))

    return (
        f"step {step}/{total} reward {get('reward/mean'):.2f} kept {int(get('batch/kept'))}/{int(get('batch/sampled'))} "
        f"len {get('response/length_mean'):.0f}/{get('response/length_max'):.0f} trunc {get('response/truncated_frac'):.0%} "
        f"ent {get('actor/entropy'):.2f} coef {get('entropy/coef'):.4f} loss {get('actor/pg_loss'):+.3f} "
        f"clip {get('actor/clip_frac'):.2f} gn {get('actor/grad_norm'):.2f} lr {get('actor/lr'):.1e} "
        f"{get('time/step'):.1f}s (gen {get('time/generate'):.1f}s) {get('perf/tokens_per_s'):.0f} tok/s"
        f"{rates_text(m)}{async_text(m)}"
    ) + (f" | validation: {val}" if val else "")


def async_text(m: dict[str, Any]) -> str:
    """` stale 1 idle 0.2s`: under the separate placement, the trained batch's largest staleness and the seconds the
    trainer waited for it."""
    if STALENESS_MAX not in m:
        return ""
    return f" stale {m[STALENESS_MAX]:.0f} idle {m.get('time/trainer_idle', 0.0):.1f}s"


def rates_text(m: dict[str, Any]) -> str:
    """` (gen 2360 upd 3100) mfu 1.2%`, each part only when the step logged it."""
    rates = [
        f"{name} {m[key]:.0f}"
        for name, key in (("gen", "perf/generate_tokens_per_s"), ("upd", "perf/update_tokens_per_s"))
        if key in m
    ]
    text = f" ({' '.join(rates)})" if rates else ""
    return text + (f" mfu {m['perf/update_mfu']:.1%}" if "perf/update_mfu" in m else "")


def write_step_samples(stage_dir: Path, step: int, batch: Batch, count: int) -> Path | None:
    """The first `count` sampled responses of a step (with ground truth, score, reason, scoring seconds and node, the
    policy version that sampled it), then
    the step's slowest-scored rows not among them (marked `slowest`), as samples/step_<N>.jsonl."""
    if count <= 0 or len(batch) == 0:
        return None
    nt, scores = batch.non_tensor, batch.tensors.get(SCORES)
    slowest = slowest_rows(nt[SCORE_SECONDS]) if SCORE_SECONDS in nt else []
    picked = list(range(min(count, len(batch))))
    picked += [i for i in slowest if i not in picked]
    rows = []
    for i in picked:
        reward_model = nt[REWARD_MODEL][i] if REWARD_MODEL in nt else None
        row = {
            "step": step,
            "prompt_key": str(nt[PROMPT_KEY][i]) if PROMPT_KEY in nt else None,
            "data_source": str(nt[DATA_SOURCE][i]) if DATA_SOURCE in nt else None,
            "response": str(nt[RESPONSE_TEXT][i]) if RESPONSE_TEXT in nt else None,
            "ground_truth": reward_model.get("ground_truth") if isinstance(reward_model, dict) else None,
            "score": float(scores[i]) if scores is not None else None,
            "reason": str(nt[SCORE_REASON][i]) if SCORE_REASON in nt else None,
        }
        if SCORE_SECONDS in nt:
            row.update(score_seconds=float(nt[SCORE_SECONDS][i]), slowest=i in slowest)
        if SCORE_NODE in nt:
            row["score_node"] = str(nt[SCORE_NODE][i])
        if POLICY_VERSION in batch.tensors:
            row["policy_version"] = int(batch.tensors[POLICY_VERSION][i])
        rows.append(row)
    folder = stage_dir / SAMPLES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"step_{step}.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in rows))
    return path
