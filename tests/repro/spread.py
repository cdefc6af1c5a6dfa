"""The CI chain's spread over torch's CPU kernels and training seeds: `python tests/repro/spread.py --out DIR`.

From the base shipped with or1 (the same bits on every machine), for each kernel choice ("native": what torch picks on
this CPU; "avx2", "default": that ATEN_CPU_CAPABILITY) and trainer seed it runs the chain of test_tiny_chain.py and checks it with the test's own check_chain. Runs already
finished under DIR are read again, not retrained, so an interrupted measurement resumes. Prints one table row per
run (validations, always-solved prompts, pass or the failed check) and writes them to DIR/readings.jsonl. About 11
minutes per run on 2 cores; the first line names the processor.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from or1.tinyworld.init import machine_description

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_tiny_chain import (  # noqa: E402
    BASE,
    ENV,
    chain_data,
    chain_readings,
    check_chain,
    train_chain,
)


def kernel_env(kernel: str) -> dict[str, str]:
    return ENV if kernel == "native" else {**ENV, "ATEN_CPU_CAPABILITY": kernel}


def measure(out: Path, kernel: str, seed: int, overrides: list[str]) -> dict:
    env = kernel_env(kernel)
    run_folder = out / kernel / f"seed{seed}"
    run = run_folder / "run"
    if not (run / "stage3" / "summary.json").is_file():
        run_folder.mkdir(parents=True, exist_ok=True)
        train_chain(run_folder, BASE, chain_data(out / "data"), [f"trainer.seed={seed}", *overrides], env)
    readings = {"cpu": machine_description()["cpu"], "kernel": kernel, "seed": seed, **chain_readings(run)}
    try:
        check_chain(run)
        readings["result"] = "pass"
    except AssertionError as err:
        readings["result"] = f"FAIL: {(str(err) or 'an assertion without a message').splitlines()[0]}"
    return readings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--kernels", nargs="+", default=["native", "avx2", "default"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--set", nargs="*", default=[], help="extra --set overrides for every run")
    args = parser.parse_args()
    print(f"processor: {machine_description()['cpu']}")
    print(
        "| kernel | seed | base | stage 1 | stage 2 | stage 3 | code base | code s1 | code s2 | code s3 "
        "| stage 1 ends | always solved (1, 2) | result |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kernel in args.kernels:
        for seed in args.seeds:
            r = measure(args.out, kernel, seed, args.set)
            with open(args.out / "readings.jsonl", "a") as f:
                f.write(json.dumps(r) + "\n")
            keys = (
                "base",
                "stage1",
                "stage2",
                "stage3",
                "code_base",
                "code_stage1",
                "code_stage2",
                "code_stage3",
            )
            vals = " | ".join(f"{r[k]:.1%}" for k in keys)
            end = r["stage1_end"] or "-"
            print(
                f"| {kernel} | {seed} | {vals} | {end} | {r['always_solved']} | {r['result']} |", flush=True
            )


if __name__ == "__main__":
    main()
