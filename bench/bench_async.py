"""Steps per minute of asynchronous RL against synchronous, on the tiny mixed world (arithmetic and programs).

Usage (from the repository root, after `or1 init-model` / `or1 prepare-data` made tiny/model and tiny/data):
    .venv/bin/python bench/bench_async.py [--steps 30] [--warmup 5] [--rounds 2]

Settings of stage 1 of stages/tiny.yaml through the real command line, in turns, each with token-level TIS (the
correction k > 0 requires and every GPU recipe runs, so only the placement and k differ; one optimizer step per
batch, so every setting's update takes its old log-probs and weights from its own forward):
- colocated: today's synchronous recipe (2 data-parallel ranks, each samples then trains);
- separate k=0: one rollout replica process and one trainer process, one core each, synchronous (the replica
  samples while the trainer waits, then the trainer trains while the replica waits);
- separate k=1: the same placement with rollout.max_staleness 1 (the replica samples step s+1 while the trainer trains
  step s).
Validation and checkpoints are off; a step's time is the loop's own time/step (from taking the step's batch to the end
of its update). The medians after the warm-up steps give steps per minute, and the last lines the ratios in this run:
k=1 / k=0 on the same placement and objective (target >= 1.5), k=1 / colocated.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEPARATE = ["rollout.placement=separate", "trainer.devices_per_node=1", "trainer.threads_per_worker=1"]
TIS = ["algorithm.rollout_correction.is_level=token"]  # the GPU recipes' correction, which k > 0 requires
SETTINGS = {
    "colocated": TIS,
    "separate k=0": [*SEPARATE, *TIS],
    "separate k=1": [*SEPARATE, *TIS, "rollout.max_staleness=1"],
}


def run(name: str, overrides: list[str], args: argparse.Namespace, folder: Path) -> list[dict]:
    """One `or1 train` of stage 1 under `overrides`: its steps' records (each with time/step)."""
    run_dir = folder / name.replace(" ", "_").replace("=", "").replace(",", "")
    sets = [
        f"model.path={args.model}",
        f"data.train_files=[{args.data}/train.parquet,{args.data}/code_train.parquet]",
        "data.validation.sets=[]",
        f"trainer.steps={args.steps + args.warmup}",
        "trainer.save_every=100000",
        "trainer.loggers=[jsonl]",
        *overrides,
    ]
    cmd = [str(ROOT / ".venv/bin/or1"), "train", "--recipe", str(ROOT / "stages/tiny.yaml"), "--stage", "1"]
    cmd += ["--run-dir", str(run_dir), "--resume", "never", "--overwrite"]
    cmd += [x for s in sets for x in ("--set", s)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
    rows = [json.loads(line) for line in (run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "time/step" in r]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny/model")
    parser.add_argument("--data", default="tiny/data")
    parser.add_argument("--steps", type=int, default=30, help="steps timed per run, after the warm-up")
    parser.add_argument("--warmup", type=int, default=5, help="first steps of each run left out")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each setting, taking turns")
    args = parser.parse_args()
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, overrides in SETTINGS.items():
                steps = [rec["time/step"] for rec in run(name, overrides, args, Path(tmp) / f"round{r}")]
                times[name] += steps[args.warmup :]
                print(
                    f"round {r + 1} {name}: median {statistics.median(steps[args.warmup :]):.2f} s/step",
                    flush=True,
                )
    per_min = {name: 60.0 / statistics.median(t) for name, t in times.items()}
    print("\n| setting | median s/step | steps/min |\n|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t):.2f} | {per_min[name]:.1f} |")
    same = per_min["separate k=1"] / per_min["separate k=0"]
    print(
        f"\nk=1 / k=0, separate placement: {same:.2f}x steps/min (target >= 1.5: {'met' if same >= 1.5 else 'NOT met'})"
    )
    print(f"k=1 / colocated synchronous: {per_min['separate k=1'] / per_min['colocated']:.2f}x steps/min")
    print(json.dumps({"steps_per_min": per_min, "k1_over_k0": same}))


if __name__ == "__main__":
    main()
