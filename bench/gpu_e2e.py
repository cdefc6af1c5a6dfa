"""The prepared end-to-end check of or1 on one CUDA GPU, in at most 8 minutes, and its CPU rehearsal.

Usage, from the project root:
    python3 bench/gpu_e2e.py OUTDIR          one CUDA GPU, the GPU kit installed (docs/one-gpu.md)
    .venv/bin/python bench/gpu_e2e.py OUTDIR --cpu
                                             the rehearsal: every section on the CPU at tiny shapes (gloo, float32),
                                             the kit built and installed from a local folder; CI runs it

Sections, each within its own time budget (a section that overruns is killed and reported as `timeout`), each
result one JSON line in OUTDIR/results.jsonl, the logs in OUTDIR/logs/, and a summary table whatever happened:
- kit:    or1's dependencies import from the kit's folder (--cpu: the kit is built, then installed by its own line);
- doctor: `or1 doctor`;
- pytest: `pytest -m gpu` (`-m "gpu and not vllm"` where vLLM is missing);
- tiny:   the tiny world on the HF engine from the shipped base (bf16 compute, offload, packed rows through flash
          varlen, token TIS on CUDA): stage 1 for 6 steps straight, the same stage interrupted by SIGINT once step 3
          is logged and resumed, then stage 2 for 2 steps; the resume checked against the straight run (below);
- eval:   `or1 eval` of the result and `or1 report` of the run;
- shapes: bench/gpu_check.py at real shapes (--cpu: its dry shapes), with both rollout engines where vLLM is
          installed: update tokens/s, MFU, each phase's peak beside `or1 plan`'s number.
Exit status 0 when every section is ok.

The resume check: the interrupted run's steps up to the stop are not rewritten by the resume, and equal the straight
run's in every key but time/ and perf/; the first resumed step samples the straight run's responses; loss and reward
of the resumed steps agree with the straight run's. On the CPU all of it is exact. On CUDA the backward of flash
varlen attention is not deterministic, so after the first update the two runs' weights part at float rounding:
numbers agree within CUDA_TOLERANCE and at least CUDA_SAME_RESPONSES of the first resumed step's responses are the
straight run's (a resume that lost the sampler's seeds or the weights would share almost none).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OR1 = [sys.executable, "-m", "or1.cli"]
ENV = {**os.environ, "COLUMNS": "1000", "PYTHONUNBUFFERED": "1"}  # rich wraps at 80 columns off a terminal
BUDGETS = {  # seconds per section: (one CUDA GPU, the CPU rehearsal); each column adds up to at most 8 / 5 minutes
    "kit": (15, 55),
    "doctor": (30, 15),
    "pytest": (75, 25),
    "tiny": (180, 135),
    "eval": (60, 30),
    "shapes": (120, 40),
}
STEPS, INTERRUPT_AFTER, STAGE2_STEPS = 6, 3, 2
CUDA_TOLERANCE = {"rel": 0.05, "abs": 0.02}  # |a - b| <= rel * max(|a|, |b|) + abs, per value
CUDA_SAME_RESPONSES = 0.9
JUNIT_COUNTS = ("tests", "failures", "errors", "skipped")
KIT_MODULES = ["ray", "pydantic", "math_verify", "datasets", "datasketch", "jsonschema", "pytest"]


class Overrun(Exception):
    """A section's budget ran out: its processes were killed."""


class Failed(Exception):
    """A section's check did not hold: the message says which."""


@dataclass
class Section:
    """One section's clock, logs and result."""

    name: str
    budget_s: float
    out: Path
    started: float = field(default_factory=time.monotonic)
    result: dict = field(default_factory=dict)
    runs: int = 0

    def remaining(self) -> float:
        return self.budget_s - (time.monotonic() - self.started)

    def start(self, cmd: list[str], env: dict | None = None) -> tuple[subprocess.Popen, Path]:
        """Start `cmd` in its own process group (so a timeout or a Ctrl-C reaches all of it), logging to a file."""
        self.runs += 1
        log = self.out / "logs" / f"{self.name}-{self.runs}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as sink:
            sink.write("$ " + shlex.join(cmd) + "\n")
            sink.flush()
            proc = subprocess.Popen(
                cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, env=env or ENV, start_new_session=True
            )
        return proc, log

    def wait(self, proc: subprocess.Popen) -> int:
        try:
            return proc.wait(timeout=max(self.remaining(), 0.1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise Overrun from None

    def run(self, cmd: list[str], ok: tuple[int, ...] = (0,), env: dict | None = None) -> tuple[int, str]:
        """Run `cmd` to its end within the budget; its exit status and output. A status outside `ok` fails."""
        proc, log = self.start(cmd, env)
        code = self.wait(proc)
        text = log.read_text(errors="replace")
        if code not in ok:
            raise Failed(
                f"{shlex.join(cmd[2:] if cmd[:2] == OR1[:2] else cmd)[:120]} exited {code}: {last_line(text)}"
            )
        return code, text


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else "(no output)"


# ---------------------------------------------------------------------------------------------------------- sections


def kit(section: Section, cpu: bool) -> None:
    """--cpu: build the kit with scripts/gpu_kit.py for this Python and install it by its own line into
    OUTDIR/site, then or1's dependencies must import from there; on a GPU node (the kit installed before the check)
    the section says where each comes from."""
    env, site = ENV, None
    if cpu:
        kit_dir, site = section.out / "kit", section.out / "site"
        python = f"{sys.version_info.major}.{sys.version_info.minor}"
        section.run([sys.executable, "scripts/gpu_kit.py", "--python", python, "--out", str(kit_dir)])
        section.run(["bash", str(kit_dir / "install.sh"), str(site)], env={**ENV, "PYTHON": sys.executable})
        env = {**ENV, "PYTHONPATH": f"{site}:{ROOT / 'src'}"}
        files = [f for f in kit_dir.rglob("*") if f.is_file()]
        section.result["kit_mib"] = round(sum(f.stat().st_size for f in files) / 2**20, 1)
    probe = "import importlib, json; print(json.dumps({m: importlib.import_module(m).__file__ for m in %r}))"
    _, text = section.run([sys.executable, "-c", probe % KIT_MODULES], env=env)
    found = json.loads(text.strip().splitlines()[-1])
    if site is not None and (
        outside := [m for m, path in found.items() if not Path(path).is_relative_to(site)]
    ):
        raise Failed(f"not imported from the kit: {', '.join(outside)}")
    section.result["from"] = sorted({str(Path(path).parents[1]) for path in found.values()})


def vllm_installed() -> bool:
    return subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode == 0


def doctor(section: Section, cpu: bool) -> None:
    code, text = section.run([*OR1, "doctor"], ok=(0, 1))
    verdict = [line for line in text.splitlines() if line.strip()][-1:]
    section.result.update(
        exit=code,
        verdict=verdict[0].strip().removeprefix("verdict:").strip()[:200] if verdict else "",
        bwrap=bool(shutil.which("bwrap")),
    )


def pytest_gpu(section: Section, cpu: bool) -> None:
    """The gpu-marked tests (only the files that hold them, so collection stays short); on the CPU they all skip."""
    files = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if re.search(r"mark\.gpu\b|pytest\.mark\.gpu", path.read_text())
    )
    marker = "gpu" if vllm_installed() else "gpu and not vllm"
    xml, measurements = section.out / "pytest.xml", section.out / "measurements.jsonl"
    section.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            marker,
            f"--junitxml={xml}",
            *files,
        ],
        ok=(0, 5),  # 5: nothing collected
        env={**ENV, "OR1_GPU_MEASUREMENTS": str(measurements)},  # what the tests measure (the head dtype)
    )
    text = xml.read_text()
    total, failures, errors, skipped = (int(re.search(rf'{k}="(\d+)"', text).group(1)) for k in JUNIT_COUNTS)
    section.result.update(
        marker=marker, passed=total - failures - errors - skipped, failed=failures + errors, skipped=skipped
    )


def tiny(section: Section, cpu: bool) -> None:
    """Stage 1 straight and interrupted-then-resumed side by side, then stage 2; the resume checked."""
    work = section.out / "tiny"
    shutil.rmtree(work, ignore_errors=True)  # a run folder left from an earlier check would be resumed
    model, data = work / "model", work / "data"
    section.run([*OR1, "init-model", "--preset", "tiny", "--out", str(model)])
    section.run([*OR1, "prepare-data", "--seed", "0", "--out", str(data)])
    math_only = not shutil.which("bwrap")  # programs are scored in the bubblewrap sandbox
    train_files = [data / "train.parquet"] + ([] if math_only else [data / "code_train.parquet"])
    sets = {
        "model.path": str(model),
        "data.train_files": "[" + ",".join(map(str, train_files)) + "]",
        "data.validation.sets": f"[{data / 'validation.parquet'}]",
        "data.validation.max_problems": "8",
        "rollout.engine": "hf",
        "trainer.steps": str(STEPS),
        "trainer.save_every": str(STEPS),  # nothing due at the interrupt: the stop writes its own checkpoint
        "trainer.keep_checkpoints": "3",
        "trainer.samples_per_step": "100000",  # every sampled response, in order: the resume check compares them all
    }
    if cpu:
        sets.update(
            {
                "trainer.device": "cpu",
                "model.dtype": "float32",
                "trainer.batch_size": "8",
                "actor.ppo_mini_batch_size": "8",
            }
        )

    def train(run_dir: Path, stage: int = 1, **more: str) -> list[str]:
        pairs = {**sets, **more}
        return [*OR1, "train", "--recipe", "stages/tiny-gpu.yaml", "--stage", str(stage), "--run-dir", str(run_dir),
                *[a for k, v in pairs.items() for a in ("--set", f"{k}={v}")]]  # fmt: skip

    straight_dir, resumed_dir = work / "straight", work / "resumed"
    straight, _ = section.start(train(straight_dir))
    interrupted, log = section.start(train(resumed_dir))
    while INTERRUPT_AFTER not in logged_steps(resumed_dir):
        if interrupted.poll() is not None:
            raise Failed(
                f"the interrupted run ended before step {INTERRUPT_AFTER}: {last_line(log.read_text())}"
            )
        if section.remaining() <= 0:
            for proc in (straight, interrupted):
                os.killpg(proc.pid, signal.SIGKILL)
            raise Overrun
        time.sleep(0.05)
    os.killpg(interrupted.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the whole process group
    code = section.wait(interrupted)
    stop_text = log.read_text(errors="replace")
    if code != 130 or "to resume, run:" not in stop_text:
        raise Failed(f"Ctrl-C: exit {code} (expected 130 and a resume line): {last_line(stop_text)}")
    before = records(resumed_dir)
    section.run(train(resumed_dir))
    if section.wait(straight) != 0:
        raise Failed("the straight run failed: see logs/tiny-*.log")
    section.result.update(
        math_only=math_only, stopped_after=max(before), **compare_runs(straight_dir, resumed_dir, before, cpu)
    )
    section.run(train(resumed_dir, stage=2, **{"trainer.steps": str(STAGE2_STEPS)}))
    stage2 = logged_steps(resumed_dir, stage=2)
    if stage2[-1:] != [STAGE2_STEPS]:
        raise Failed(f"stage 2 logged steps {stage2}, expected 1..{STAGE2_STEPS}")
    section.result["stage2_reward"] = records(resumed_dir, stage=2)[STAGE2_STEPS]["reward/mean"]


def evaluate(section: Section, cpu: bool) -> None:
    run_dir = section.out / "tiny" / "resumed"
    final = run_dir / "stage2" / "final"
    if not (final / "config.json").is_file():
        raise Failed("no stage-2 model to evaluate (the tiny section did not finish)")
    out = section.out / "eval"
    validation = section.out / "tiny" / "data" / "validation.parquet"
    section.run([*OR1, "eval", str(validation), "--model", str(final), "--n", "2", "--max-tokens", "64",
                 "--limit", "16" if cpu else "100", "--out", str(out), "--overwrite"])  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    section.run([*OR1, "report", str(run_dir)])
    if not (run_dir / "report.md").is_file():
        raise Failed("or1 report wrote no report.md")
    metrics = summary["metrics"]
    avg = metrics["estimates"][f"avg@{metrics['samples_per_problem']}"]["value"]
    build = summary["engine_build"]
    section.result.update(avg=round(avg, 4), engine=f"{build['name']} {build['dtype']} ({build['version']})")


def shapes(section: Section, cpu: bool) -> None:
    rows = section.out / "shapes.jsonl"
    budget = max(int(section.remaining()) - 20, 1)  # leave time to write the rows after the last case
    cmd = [
        sys.executable,
        "bench/gpu_check.py",
        "--out",
        str(rows),
        "--budget-s",
        str(budget),
        "--timeout",
        str(budget),
    ]
    engines = "hf,vllm" if vllm_installed() else "hf"  # a GPU node has no vLLM (docs/one-gpu.md)
    section.run(cmd + ["--engines", engines] + (["--dry-run"] if cpu else []))
    cases = [json.loads(line) for line in rows.read_text().splitlines() if line.strip()]
    section.result.update(
        cases=len(cases),
        statuses=sorted({case.get("status", "ok") for case in cases}),
    )
    if not any(case.get("status", "ok") == "ok" for case in cases):
        raise Failed("no shape ran")


SECTIONS = {
    "kit": kit,
    "doctor": doctor,
    "pytest": pytest_gpu,
    "tiny": tiny,
    "eval": evaluate,
    "shapes": shapes,
}


# ----------------------------------------------------------------------------------------------- the resume check


def logged_steps(run_dir: Path, stage: int = 1) -> list[int]:
    return sorted(s for s in records(run_dir, stage) if s > 0)


def records(run_dir: Path, stage: int = 1) -> dict[int, dict]:
    """The stage's metrics by step (validation-only lines merged into their step), as metrics.jsonl holds them."""
    path = run_dir / f"stage{stage}" / "metrics.jsonl"
    merged: dict[int, dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.endswith("}"):
                row = json.loads(line)
                merged.setdefault(row["step"], {}).update(row)
    return merged


def compared(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(("time/", "perf/"))}


def agree(a, b, exact: bool) -> bool:
    if exact or not all(isinstance(x, (int, float)) for x in (a, b)):
        return a == b
    return abs(a - b) <= CUDA_TOLERANCE["rel"] * max(abs(a), abs(b)) + CUDA_TOLERANCE["abs"] or (
        math.isnan(a) and math.isnan(b)
    )


def differing(a: dict, b: dict, exact: bool) -> list[str]:
    keys = sorted(set(compared(a)) | set(compared(b)))
    return [k for k in keys if k not in a or k not in b or not agree(a[k], b[k], exact)]


def responses(run_dir: Path, step: int) -> list[tuple[str, str]]:
    path = run_dir / "stage1" / "samples" / f"step_{step}.jsonl"
    return [(row["prompt_key"], row["response"]) for row in map(json.loads, path.read_text().splitlines())]


def compare_runs(straight_dir: Path, resumed_dir: Path, before: dict[int, dict], cpu: bool) -> dict:
    """The resume check (module docstring); raises Failed naming what differs."""
    exact = cpu
    straight, resumed = records(straight_dir), records(resumed_dir)
    stop = max(before)
    for step, row in before.items():  # the resume appends; it never rewrites what was logged
        if compared(resumed[step]) != compared(row):
            raise Failed(
                f"step {step} was rewritten by the resume: {differing(row, resumed[step], True)[:5]}"
            )
    for step in sorted(before):
        if diff := differing(straight[step], resumed[step], exact):
            raise Failed(f"step {step} (before the stop) differs from the straight run in {diff[:5]}")
    first = stop + 1
    a, b = responses(straight_dir, first), responses(resumed_dir, first)
    if len(a) != len(b):
        raise Failed(f"step {first}, the first resumed: {len(b)} responses, the straight run {len(a)}")
    same = sum(x == y for x, y in zip(a, b, strict=True)) / max(len(a), 1)
    if same < (1.0 if exact else CUDA_SAME_RESPONSES):
        raise Failed(
            f"step {first}, the first resumed: {same:.0%} of {len(a)} responses are the straight run's"
        )
    worst = 0.0
    for step in range(first, STEPS + 1):
        for key in ("reward/mean", "actor/pg_loss"):
            x, y = straight[step][key], resumed[step][key]
            if not agree(x, y, exact):
                raise Failed(f"step {step} {key}: straight {x:.6g}, resumed {y:.6g}")
            worst = max(worst, abs(x - y))
    return {"same_responses": same, "resumed_max_abs_diff": worst, "exact": exact}


# ------------------------------------------------------------------------------------------------------- the driver


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="Folder for results.jsonl, the logs and each section's files.")
    parser.add_argument(
        "--cpu", action="store_true", help="The rehearsal on the CPU (tiny shapes, gloo, float32)."
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help="Comma-separated subset, in this order."
    )
    parser.add_argument(
        "--budget-scale",
        type=float,
        default=1.0,
        help="Multiply every section's budget (the test suite gives the rehearsal room: a loaded machine is no bug).",
    )
    args = parser.parse_args(argv)
    names = args.sections.split(",")
    if unknown := sorted(set(names) - set(SECTIONS)):
        parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")
    if not args.cpu and not cuda_available():
        parser.error("no CUDA GPU visible here: run with --cpu for the rehearsal")
    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    with (args.out / "results.jsonl").open("w") as sink:
        for name in names:
            result = run_section(name, args.out, args.cpu, args.budget_scale)
            results.append(result)
            sink.write(json.dumps(result) + "\n")
            sink.flush()
            print(f"{name}: {result['status']} in {result['seconds']:.0f} s", flush=True)
    print(summary_table(results))
    return 0 if all(r["status"] == "ok" for r in results) else 1


def run_section(name: str, out: Path, cpu: bool, budget_scale: float = 1.0) -> dict:
    section = Section(name, BUDGETS[name][1 if cpu else 0] * budget_scale, out)
    try:
        SECTIONS[name](section, cpu)
        status = "ok"
    except Overrun:
        status = "timeout"
    except Failed as failure:
        status, section.result["error"] = "failed", str(failure)
    except Exception as error:  # a bug in the check itself: reported, and the other sections still run
        status, section.result["error"] = "error", f"{type(error).__name__}: {error}"[:300]
    seconds = round(time.monotonic() - section.started, 1)
    return {
        "section": name,
        "status": status,
        "seconds": seconds,
        "budget_s": section.budget_s,
        **section.result,
    }


def summary_table(results: list[dict]) -> str:
    lines = ["", "| section | status | seconds (budget) | result |", "|---|---|---|---|"]
    for r in results:
        facts = {k: v for k, v in r.items() if k not in ("section", "status", "seconds", "budget_s")}
        shown = "; ".join(f"{k} {v}" for k, v in facts.items())
        lines.append(
            f"| {r['section']} | {r['status']} | {r['seconds']:.0f} ({r['budget_s']:.0f}) | {shown[:300]} |"
        )
    return "\n".join(lines)


def cuda_available() -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() == "True"


if __name__ == "__main__":
    sys.exit(main())
