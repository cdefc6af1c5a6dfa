"""Seconds per RL step: or1 against TRL's GRPOTrainer on the tiny world, matched settings, interleaved runs.

Usage (from the repository root, after `or1 init-model` / `or1 prepare-data` made tiny/model and tiny/data):
    .venv/bin/python bench/rl_step.py [--steps 60] [--rounds 2] [--warmup 5] [--scaling-steps 12]
                                      [--no-trl] [--no-scaling] [--trl-scaling]
or `just bench`. A smoke run: --steps 4 --warmup 1 --rounds 1 --scaling-steps 3.

or1 runs through its real command line (`or1 train --recipe stages/tiny.yaml --stage 1`, only trainer.steps and the
scaling points overridden) and its step times are the loop's own `time/step` and per-phase `time/*` columns of
metrics.jsonl. TRL 1.16's GRPOTrainer runs in a subprocess from `.venv-bench`, a venv this script makes on top of
.venv (a .pth file shares its torch and transformers; only trl and accelerate are installed there, and the script
checks that torch and transformers still come from .venv), never in or1's own install; its step time is the wall
time between two `on_step_end` callbacks. Both train the same model on the same prompts with the same reward (or1's
math verifier, a response cut off at the budget scores 0), 16 prompts x 8 samples, a 48-token budget, AdamW at a
constant lr of 5e-5, fp32, grad-norm clip 1.0, token-mean loss (TRL's `dapo`), group-normalised advantages, no KL,
one optimizer step per batch and the tiny recipe's adaptive entropy bonus. What differs by design: or1 drops the
groups without reward variance from the batch before the log-prob and update passes (rejection sampling); TRL keeps
them with advantage 0, so they cost compute and count in its token-mean denominator. or1 uses 2 ranks x 1 thread,
TRL 1 process x 2 threads, so both use the machine's two cores.

Runs alternate (or1, TRL, or1, TRL, ...); the medians after the warm-up steps are reported per run and over all
runs. Start-up is from launching the command to the end of the first step (or1: rank actors, model loading and the
recipe's step-0 validation included; TRL has no validation). The scaling part times or1 (and TRL with --trl-scaling)
as the group size n and the response budget double. The last line is the ratio TRL s/step / or1 s/step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH_VENV = ROOT / ".venv-bench"
TRL_VERSION = "1.16.0"
RECIPE = "stages/tiny.yaml"
# or1's per-phase columns (time/<phase> in metrics.jsonl) that run the model: sampling, forward, backward
MODEL_PHASES = ("generate", "old_log_prob", "ref_log_prob", "values", "update", "critic_update")


@dataclass(frozen=True)
class Settings:
    """One bench configuration, shared by both frameworks (the tiny recipe's stage 1 unless a scaling point)."""

    model_dir: str = "tiny/model"
    train_file: str = "tiny/data/train.parquet"
    prompts: int = 16
    n: int = 8
    max_tokens: int = 48
    lr: float = 5e-5
    grad_clip: float = 1.0
    temperature: float = 1.0
    seed: int = 0
    # the tiny recipe's adaptive entropy control (algorithm.entropy)
    entropy_target: float = 0.09
    entropy_delta: float = 0.0005
    entropy_max_coef: float = 0.005

    def or1_overrides(self) -> list[str]:
        """--set overrides of `or1 train --recipe stages/tiny.yaml --stage 1` for these settings."""
        return [
            f"model.path={self.model_dir}",
            f"data.train_files=[{self.train_file}]",
            f"trainer.batch_size={self.prompts}",
            f"actor.ppo_mini_batch_size={self.prompts}",
            f"rollout.n={self.n}",
            f"rollout.max_response_length={self.max_tokens}",
            f"actor.lr={self.lr}",
            f"actor.grad_clip={self.grad_clip}",
            f"rollout.temperature={self.temperature}",
            f"trainer.seed={self.seed}",
            # the entropy control TRL is given, so the two cannot drift apart when the recipe changes
            f"algorithm.entropy.target={self.entropy_target}",
            f"algorithm.entropy.delta={self.entropy_delta}",
            f"algorithm.entropy.max_coef={self.entropy_max_coef}",
        ]

    def describe(self) -> str:
        return (
            f"{self.prompts} prompts x {self.n} samples, {self.max_tokens}-token budget, lr {self.lr:g}, fp32"
        )


@dataclass
class RunResult:
    """One run of one framework: per-step seconds (step 1 first), start-up seconds, or1's per-phase seconds."""

    framework: str
    step_seconds: list[float]
    startup_s: float
    phases: dict[str, list[float]] = field(default_factory=dict)  # or1: time/<phase> per step, 0 when absent
    skipped: int = 0  # or1: steps without a group with reward variance (no update)
    load: str = ""  # uptime's load averages when the run ended

    def median(self, warmup: int) -> float:
        return median_after_warmup(self.step_seconds, warmup)


def median_after_warmup(values: Sequence[float], warmup: int) -> float:
    """Median of values[warmup:]; all of them when the run is too short to drop any."""
    kept = list(values[warmup:]) if len(values) > warmup else list(values)
    if not kept:
        raise ValueError("no steps to take a median of")
    return statistics.median(kept)


def parse_or1_metrics(lines: Sequence[str]) -> tuple[list[float], dict[str, list[float]], int]:
    """(time/step per step, time/<phase> per step, skipped steps) from metrics.jsonl lines; step 0 (validation)
    and duplicate steps (a resumed run's earlier lines) are left out."""
    rows: dict[int, dict] = {}
    for line in lines:
        if line.strip():
            record = json.loads(line)
            if record["step"] >= 1 and "time/step" in record:
                rows[record["step"]] = record
    ordered = [rows[s] for s in sorted(rows)]
    names = sorted({k.removeprefix("time/") for r in ordered for k in r if k.startswith("time/")} - {"step"})
    phases = {name: [float(r.get(f"time/{name}", 0.0)) for r in ordered] for name in names}
    skipped = sum(1 for r in ordered if r.get("skipped"))
    return [float(r["time/step"]) for r in ordered], phases, skipped


def trl_steps(lines: Sequence[str], launched: float) -> tuple[float, list[float]]:
    """(start-up, per-step seconds) from the worker's step records ({"step", "begin", "end"} wall times, one JSON
    per line) and the launch time: start-up runs to the first step's end, a step from its begin to its end."""
    records = [json.loads(line) for line in lines if line.strip()]
    if not records:
        raise ValueError("the run finished no step")
    return records[0]["end"] - launched, [r["end"] - r["begin"] for r in records]


def phase_shares(result: RunResult, warmup: int) -> dict[str, float]:
    """Median seconds of each phase after the warm-up (phases that never ran are left out)."""
    out = {}
    for name, values in result.phases.items():
        value = median_after_warmup(values, warmup)
        if value > 0 or any(values):
            out[name] = value
    return out


def model_share(phases: dict[str, float], step_s: float) -> float:
    """Fraction of the step spent in model compute (generation, forward and backward passes)."""
    return sum(v for k, v in phases.items() if k in MODEL_PHASES) / step_s


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable in a terminal)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def load_average() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


# --- or1 --------------------------------------------------------------------------------------------------------


def run_or1(settings: Settings, steps: int, run_dir: Path, extra: Sequence[str] = ()) -> RunResult:
    """`or1 train` of the tiny recipe's stage 1 for `steps` steps; start-up is until metrics.jsonl has step 1."""
    command = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--stage", "1"]
    command += ["--run-dir", str(run_dir), "--resume", "never", "--overwrite"]
    for override in [
        *settings.or1_overrides(),
        f"trainer.steps={steps}",
        f"trainer.save_every={steps}",
        *extra,
    ]:
        command += ["--set", override]
    metrics = run_dir / "stage1" / "metrics.jsonl"
    start = time.time()
    first_step = _run_watching(command, run_dir / "or1.log", lambda: _has_step(metrics, 1))
    step_s, phases, skipped = parse_or1_metrics(metrics.read_text().splitlines())
    return RunResult("or1", step_s, first_step - start, phases, skipped, load_average())


def _has_step(metrics: Path, step: int) -> bool:
    if not metrics.is_file():
        return False
    for line in metrics.read_text().splitlines():
        try:
            if json.loads(line)["step"] >= step:
                return True
        except (ValueError, KeyError):
            continue  # a line being written
    return False


def _run_watching(command: list[str], log: Path, done: Callable[[], bool]) -> float:
    """Run `command` (output to `log`); the wall time at which `done()` first held, polled every 50 ms."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])),
    }
    seen = None
    with log.open("w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
        while process.poll() is None:
            if seen is None and done():
                seen = time.time()
            time.sleep(0.05)
    if process.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise SystemExit(
            f"{' '.join(command[:6])} ... failed (exit {process.returncode}); end of {log}:\n{tail}"
        )
    return seen if seen is not None else time.time()


# --- TRL --------------------------------------------------------------------------------------------------------


def bench_python() -> Path:
    """.venv-bench's python with TRL installed, made on first use; torch and transformers must stay .venv's."""
    python = BENCH_VENV / "bin" / "python"
    if not python.exists():
        print(f"making {BENCH_VENV} (TRL {TRL_VERSION} on top of .venv's packages)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
        purelib = subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
        import sysconfig

        Path(purelib, "or1-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    probe = "import importlib.util as u; print(u.find_spec('trl') is not None)"
    has_trl = (
        subprocess.run([str(python), "-c", probe], capture_output=True, text=True).stdout.strip() == "True"
    )
    if not has_trl:
        subprocess.run([str(python), "-m", "pip", "install", "-q", f"trl=={TRL_VERSION}"], check=True)
    check = "import torch, transformers; print(torch.__file__); print(transformers.__file__)"
    shared = subprocess.run(
        [str(python), "-c", check], check=True, capture_output=True, text=True
    ).stdout.split()
    import torch
    import transformers

    if shared != [torch.__file__, transformers.__file__]:
        raise SystemExit(
            f"{BENCH_VENV} imports another torch or transformers ({shared}); delete it and rerun"
        )
    return python


def run_trl(settings: Settings, steps: int, out_dir: Path, python: Path) -> RunResult:
    """TRL's GRPOTrainer for `steps` steps in a subprocess (see trl_worker)."""
    stamps = out_dir / "step_ends.jsonl"
    spec = {"settings": asdict(settings), "steps": steps, "out_dir": str(out_dir), "stamps": str(stamps)}
    out_dir.mkdir(parents=True, exist_ok=True)
    command = [str(python), str(Path(__file__).resolve()), "--trl-worker", json.dumps(spec)]
    launched = time.time()
    _run_watching(command, out_dir / "trl.log", lambda: stamps.is_file() and stamps.stat().st_size > 0)
    startup, step_s = trl_steps(stamps.read_text().splitlines(), launched)
    return RunResult("trl", step_s, startup, load=load_average())


def trl_worker(spec: dict) -> None:
    """Inside .venv-bench: build the dataset, reward and GRPOTrainer for the settings and train; append the wall time
    of every step end to spec['stamps']."""
    import torch

    torch.set_num_threads(2)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from or1.data.rows import read_rows
    from or1.rewards.score import score_batch
    from or1.tokens import load_tokenizer

    s = Settings(**spec["settings"])
    tokenizer = load_tokenizer(s.model_dir)
    rows = read_rows(s.train_file)
    # prompts as text through the same chat template or1 applies (or1.tokens.prompt_ids)
    dataset = Dataset.from_list(
        [
            {
                "prompt": tokenizer.apply_chat_template(
                    list(row["prompt"]), tokenize=False, add_generation_prompt=True
                ),
                "ground_truth": json.dumps(dict(row["reward_model"])),
                "ability": row["ability"],
            }
            for row in rows
        ]
    )
    eos = tokenizer.eos_token_id

    def or1_reward(completions, completion_ids, ground_truth, ability, **_):
        scored = score_batch(
            [
                {"ability": a, "response": c, "reward_model": json.loads(g)}
                for c, g, a in zip(completions, ground_truth, ability, strict=True)
            ],
            workers=1,
        )
        # the tiny recipe's truncated: zero_reward: a response without eos within the budget scores 0
        return [r.score if eos in ids else 0.0 for r, ids in zip(scored, completion_ids, strict=True)]

    stamps = Path(spec["stamps"])

    class StepTimes(TrainerCallback):
        # on_step_begin .. on_step_end holds generation, reward, forward, backward and the optimizer step; TRL's
        # logging after it is left out, as or1's time/step leaves out its logging and checkpoints
        def on_step_begin(self, args, state, control, **kwargs):
            self.begin = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            record = {"step": state.global_step, "begin": self.begin, "end": time.time()}
            with stamps.open("a") as f:
                f.write(json.dumps(record) + "\n")

    config = GRPOConfig(
        output_dir=spec["out_dir"],
        use_cpu=True,
        bf16=False,
        max_steps=spec["steps"],
        per_device_train_batch_size=s.prompts * s.n,
        gradient_accumulation_steps=1,
        num_generations=s.n,
        max_completion_length=s.max_tokens,
        temperature=s.temperature,
        top_p=1.0,
        top_k=0,
        learning_rate=s.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=s.grad_clip,
        beta=0.0,
        num_iterations=1,
        loss_type="dapo",
        scale_rewards="group",
        use_adaptive_entropy=True,
        entropy_coef=0.0,
        entropy_coef_delta=s.entropy_delta,
        entropy_coef_max=s.entropy_max_coef,
        entropy_target=s.entropy_target,
        seed=s.seed,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(s.model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=or1_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[StepTimes()],
    )
    trainer.train()


# --- report -----------------------------------------------------------------------------------------------------


def configurations(settings: Settings) -> str:
    or1 = (
        f"or1: `or1 train --recipe {RECIPE} --stage 1` ({settings.describe()}; token-mean loss, GRPO advantages, "
        "no KL, rejection sampling of zero-variance groups, adaptive entropy; 2 ranks x 1 thread, hf rollout "
        "engine); step time = metrics.jsonl time/step"
    )
    trl = (
        f"TRL {TRL_VERSION}: GRPOTrainer ({settings.describe()}; loss_type dapo (token-mean), scale_rewards group, "
        "beta 0, num_iterations 1, adaptive entropy as the recipe; zero-variance groups kept with advantage 0; "
        "1 process x 2 threads, transformers generate); step time = on_step_begin to on_step_end"
    )
    return f"{or1}\n{trl}"


def summary(results: list[RunResult], warmup: int) -> tuple[str, float]:
    """The per-run table and the ratio TRL s/step / or1 s/step of the medians over all runs of each."""
    rows = []
    for i, r in enumerate(results, 1):
        rows.append(
            [
                i,
                r.framework,
                len(r.step_seconds),
                f"{r.median(warmup):.2f}",
                f"{r.startup_s:.1f}",
                r.skipped,
                r.load,
            ]
        )
    lines = [table(["run", "framework", "steps", "median s/step", "start-up s", "skipped", "load"], rows)]
    medians = {}
    for name in ("or1", "trl"):
        runs = [r for r in results if r.framework == name]
        if runs:
            medians[name] = statistics.median(
                v for r in runs for v in r.step_seconds[warmup:] or r.step_seconds
            )
    for r in (r for r in results if r.framework == "or1"):
        phases = phase_shares(r, warmup)
        step = r.median(warmup)
        parts = " + ".join(f"{k} {v:.2f}" for k, v in sorted(phases.items(), key=lambda kv: -kv[1]))
        lines.append(
            f"or1 phases (median s): {parts}; model compute {model_share(phases, step):.0%} of {step:.2f}"
        )
    lines += [f"{name}: median {value:.2f} s/step over all its runs" for name, value in medians.items()]
    ratio = medians["trl"] / medians["or1"] if len(medians) == 2 else float("nan")
    return "\n".join(lines), ratio


def scaling(args: argparse.Namespace, base: Settings, work: Path, python: Path | None) -> str:
    """or1's (and with --trl-scaling TRL's) median s/step as n and the response budget double."""
    points = [("n", n, Settings(**{**asdict(base), "n": n})) for n in (4, 8, 16)]
    points += [("budget", t, Settings(**{**asdict(base), "max_tokens": t})) for t in (24, 48, 96)]
    rows, cells_of = [], {}  # the base point (n 8, budget 48) is on both lines: run once
    for i, (what, value, s) in enumerate(points):
        if (s.n, s.max_tokens) not in cells_of:
            # no validation here: only step times are read
            o = run_or1(s, args.scaling_steps, work / f"scale-{i}", extra=["data.validation.sets=[]"])
            step = o.median(args.warmup)
            cells = [f"{step:.2f}", f"{model_share(phase_shares(o, args.warmup), step):.0%}"]
            if python is not None:
                t = run_trl(s, args.scaling_steps, work / f"scale-trl-{i}", python)
                cells += [f"{t.median(args.warmup):.2f}"]
            cells_of[s.n, s.max_tokens] = [*cells, o.load]
            print(f"  {what}={value}: or1 {cells[0]} s/step", flush=True)
        rows.append([what, value, *cells_of[s.n, s.max_tokens]])
    header = ["varied", "value", "or1 s/step", "or1 model share"]
    header += ["TRL s/step"] if python is not None else []
    return table([*header, "load"], rows)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default="tiny/model")
    parser.add_argument("--train-file", default="tiny/data/train.parquet")
    parser.add_argument("--steps", type=int, default=60, help="Steps per run.")
    parser.add_argument("--rounds", type=int, default=2, help="(or1, TRL) pairs of runs.")
    parser.add_argument(
        "--warmup", type=int, default=5, help="Leading steps of each run left out of the medians."
    )
    parser.add_argument("--scaling-steps", type=int, default=12, help="Steps per scaling point.")
    parser.add_argument("--no-trl", action="store_true", help="Time or1 only (no .venv-bench, no TRL).")
    parser.add_argument("--no-scaling", action="store_true", help="Skip the n / budget scaling runs.")
    parser.add_argument("--trl-scaling", action="store_true", help="Time TRL at the scaling points too.")
    parser.add_argument("--work-dir", help="Keep the runs here (default: a temporary folder).")
    parser.add_argument("--trl-worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker:
        trl_worker(json.loads(args.trl_worker))
        return
    for path in (args.model_dir, args.train_file):
        if not (ROOT / path).exists():
            raise SystemExit(
                f"{path} not found (relative to {ROOT}); make the tiny world first (see `just tiny`)"
            )
    settings = Settings(model_dir=args.model_dir, train_file=args.train_file)
    python = None if args.no_trl else bench_python()
    print(configurations(settings), flush=True)
    with tempfile.TemporaryDirectory(prefix="or1-bench-") as tmp:
        work = Path(args.work_dir or tmp).resolve()
        results = []
        for round_ in range(args.rounds):
            results.append(run_or1(settings, args.steps, work / f"or1-{round_}"))
            print(f"round {round_ + 1} or1: {results[-1].median(args.warmup):.2f} s/step", flush=True)
            if python is not None:
                results.append(run_trl(settings, args.steps, work / f"trl-{round_}", python))
                print(f"round {round_ + 1} TRL: {results[-1].median(args.warmup):.2f} s/step", flush=True)
        report, ratio = summary(results, args.warmup)
        print(report)
        if not args.no_scaling:
            print("scaling (median s/step after the warm-up):", flush=True)
            print(scaling(args, settings, work, python if args.trl_scaling else None))
    print(f"ratio TRL s/step / or1 s/step: {ratio:.2f}x")


if __name__ == "__main__":
    main()
