"""Steps per minute of asynchronous RL with partial rollout against without, on a long-tailed tiny world.

Usage (from the repository root, after `or1 init-model --preset tiny --out tiny/model`):
    .venv/bin/or1 prepare-data --spec bench/long_tail.yaml --out tiny/long-tail
    .venv/bin/python bench/bench_partial.py [--data tiny/long-tail] [--steps 30] [--warmup 5] [--rounds 3]
        [--partial-tokens N]

Both settings are stage 1 of stages/tiny.yaml on the separate placement (one rollout replica process and one trainer
process, one core each), k = 1 with token TIS, a 64-token budget, on bench/long_tail.yaml's prompts (most answered in
about 12 tokens, a fifth in 40-59). They differ only in rollout.partial: without it the replica's call for a step
lasts as long as its longest response; with it (rounds of 32 tokens, the default for k = 1) a step's long responses
finish in the next round beside the next step's new ones. Validation and checkpoints are off; a step's time is the
loop's own time/step. Each round runs both settings in turn; the ratio of their median steps per minute is taken per
round, and the median of the rounds' ratios is the result (target >= 1.3).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_async import SEPARATE, TIS, run  # noqa: E402


def settings(data: str, partial_tokens: int | None) -> dict[str, list[str]]:
    common = [
        *SEPARATE,
        *TIS,
        "rollout.max_staleness=1",
        "rollout.max_response_length=64",
        f"data.train_files=[{data}/train.parquet]",
    ]
    partial = [
        "rollout.partial=true",
        *([f"rollout.partial_tokens={partial_tokens}"] if partial_tokens else []),
    ]
    return {"k=1": common, "k=1 partial": [*common, *partial]}


def phase_medians(rows: list[dict]) -> str:
    """Median seconds a step of the trainer waiting, the replica generating and the update."""
    keys = ("time/trainer_idle", "time/generate", "time/update")
    return ", ".join(f"{k[5:]} {statistics.median(r.get(k, 0.0) for r in rows):.2f} s" for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny/model")
    parser.add_argument("--data", default="tiny/long-tail")
    parser.add_argument("--steps", type=int, default=30, help="steps timed per run, after the warm-up")
    parser.add_argument("--warmup", type=int, default=5, help="first steps of each run left out")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting, taking turns")
    parser.add_argument(
        "--partial-tokens",
        type=int,
        help="rollout.partial_tokens (default: the recipe's, 32 for this budget)",
    )
    args = parser.parse_args()
    ratios, medians = [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, overrides in settings(args.data, args.partial_tokens).items():
                steps = run(name, overrides, args, Path(tmp) / f"round{r}")[args.warmup :]
                medians[name] = statistics.median(rec["time/step"] for rec in steps)
                print(
                    f"round {r + 1} {name}: median {medians[name]:.2f} s/step ({phase_medians(steps)})",
                    flush=True,
                )
            ratios.append(medians["k=1"] / medians["k=1 partial"])
            print(f"round {r + 1}: partial / without {ratios[-1]:.2f}x steps/min", flush=True)
    result = statistics.median(ratios)
    verdict = "met" if result >= 1.3 else "NOT met"
    print(
        f"\nk=1 with partial rollout / without: {result:.2f}x steps/min, median of {len(ratios)} rounds ({verdict})"
    )
    print(json.dumps({"ratios": ratios, "median": result}))


if __name__ == "__main__":
    main()
