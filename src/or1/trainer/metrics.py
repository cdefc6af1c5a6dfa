"""Per-step metrics: metrics.jsonl (one JSON object per step), TensorBoard scalars, and a one-line progress print.

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

METRICS_FILE = "metrics.jsonl"


class PhaseTimer:
    """Wall time of each phase of one step: `with timer("generate"): ...`; `timer.metrics()` -> time/<phase>."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        begin = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - begin

    def metrics(self) -> dict[str, float]:
        out = {f"time/{k}": v for k, v in self.seconds.items()}
        out["time/step"] = time.perf_counter() - self.start
        return out


class MetricsLogger:
    """Writes each step's metrics to the configured sinks (jsonl and tensorboard; wandb when installed)."""

    def __init__(self, stage_dir: Path, loggers: list[str], total_steps: int, console: Console | None = None):
        self.path = stage_dir / METRICS_FILE
        self.total_steps = total_steps
        self.console = console or Console()
        self.use_jsonl = "jsonl" in loggers
        self.tb = None
        if "tensorboard" in loggers:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(stage_dir / "tensorboard"))
        self.wandb = None
        if "wandb" in loggers:
            import wandb  # optional dependency: imported only when asked for

            self.wandb = wandb.init(project="or1", dir=str(stage_dir), resume="allow")

    def truncate_after(self, step: int) -> None:
        """Drop logged steps beyond `step` (written by a run that died after its last checkpoint)."""
        if not self.path.is_file():
            return
        kept = [
            line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step
        ]
        self.path.write_text("".join(line + "\n" for line in kept))

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
        self.console.print(progress_line(step, self.total_steps, metrics), highlight=False, soft_wrap=True)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()


def progress_line(step: int, total: int, m: dict[str, Any]) -> str:
    """`step 12/250 reward 0.43 kept 48/128 len 31/52 trunc 2% ent 0.31 coef 0.000 loss 0.012 gn 0.84 1.1s`."""
    val = " ".join(
        f"{k.removeprefix('val/')} {v:.1%}" for k, v in m.items() if k.startswith("val/") and "/avg@" in k
    )
    if "batch/sampled" not in m:  # a validation-only record (step 0)
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
        f"clip {get('actor/clip_frac'):.2f} gn {get('actor/grad_norm'):.2f} "
        f"{get('time/step'):.1f}s (gen {get('time/generate'):.1f}s) {get('perf/tokens_per_s'):.0f} tok/s"
    ) + (f" | validation: {val}" if val else "")
