"""Build the tiny world's base model: tokenizer, Qwen2 model, warm start, save, and measure its solve rate.

Deterministic from the seed and the processor's arithmetic: the warm start runs a fixed number of steps in a child
process on pinned kernels (PINNED_KERNELS), which made one model under torch's AVX-512, AVX2 and portable kernels on
an AMD EPYC; an Intel Xeon still built another (issue 51: 24.4% of arithmetic where the AMD base solves 51.9%, the
same tokenizer, losses parting within the first steps). So the main command does not rebuild it: it starts from the
base shipped with or1 (or1.tinyworld.shipped), and this module is how that base was made and how to make it again.
The report records the machine, the first warm-start losses and the files' hashes, so two builds can be compared.
The saved folder is a plain Hugging Face model folder; load it with or1.engines.loading (or AutoModelForCausalLM +
PreTrainedTokenizerFast).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from or1.data.synthetic import math_validation_rows
from or1.data.synthetic_code import CODE_SFT_STEPS, task_stream
from or1.data.synthetic_math import problem_stream
from or1.errors import UserError
from or1.tinyworld.architecture import TinyModelSpec, build_tiny_model, count_parameters
from or1.tinyworld.solve_rate import SolveRate, validation_solve_rate
from or1.tinyworld.tokenizer import train_tokenizer
from or1.tinyworld.warmstart import SFTConfig, SFTReport, sft_examples, warm_start
from or1.tokens import OR1_TINY_MARKER, load_tokenizer, prompt_ids

REPORT_FILE = "or1_init_report.json"
# the warm start's kernels: torch's portable ones (read once, when torch loads) and MKL's AVX2 code path, whatever
# the CPU offers (MKL picks by CPU otherwise, and an AVX-512 matrix product rounds differently)
PINNED_KERNELS = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "AVX2"}


@dataclass(frozen=True)
class LengthStats:
    """Token counts of gold responses (eos included) for one operand count."""

    mean: float
    max: int


@dataclass(frozen=True)
class InitReport:
    """What init_tiny_model built and how well the base model solves the validation split."""

    out_dir: str
    seed: int
    parameters: int
    vocab_size: int
    sft: SFTReport
    solve_rate: SolveRate  # math validation
    code_solve_rate: SolveRate  # code validation, programs run in the local sandbox
    gold_lengths: dict[int, LengthStats]
    prompt_length_max: int
    seconds: float
    cpu_seconds: float  # this process's CPU time: the wall time an idle machine would need at one thread
    threads: int
    settings: dict = field(default_factory=dict)
    machine: dict = field(default_factory=dict)  # where it was built: machine_description()
    files: dict[str, str] = field(default_factory=dict)  # sha256 of each file of the folder but this report

    @classmethod
    def read(cls, folder: str | Path) -> InitReport:
        """The report an init wrote into `folder`."""
        raw = json.loads((Path(folder) / REPORT_FILE).read_text())
        rates = {
            key: SolveRate(
                **{**raw[key], "by_difficulty": {int(k): v for k, v in raw[key]["by_difficulty"].items()}}
            )
            for key in ("solve_rate", "code_solve_rate")
        }
        return cls(
            **{
                **raw,
                **rates,
                "sft": SFTReport(**{**raw["sft"], "first_losses": tuple(raw["sft"].get("first_losses", ()))}),
                "gold_lengths": {int(k): LengthStats(**v) for k, v in raw["gold_lengths"].items()},
            }
        )


def init_tiny_model(
    out_dir: str | Path,
    seed: int = 0,
    *,
    sft_steps: int = 600,
    batch_size: int = 32,
    lr: float = 2.5e-3,
    eval_samples: int = 5,
    eval_max_new_tokens: int = 96,
    threads: int = 1,
    overwrite: bool = False,
    console: Console | None = None,
) -> InitReport:
    """Train the tiny tokenizer and model, warm-start it for `sft_steps`, save it to `out_dir`, report solve rates.

    Solve rates are measured on the fixed validation splits (200 arithmetic problems of 3..6 operands, 100 programs
    of 3..6 steps) with `eval_samples` samples per problem at temperature 1.0, after reloading the saved folder, so
    the numbers describe exactly what was written. The default 600 steps (half of each batch programs, 30% of them
    with a slip; about 7 min on one free core) gave math 51.9% and code 15.0% for seed 0 (69.5% and 33% greedy) on
    AMD EPYC processors, the same bits with and without AVX-512 (the shipped base, or1.tinyworld.shipped; the solve
    rates are sampled under this process's own kernels). One torch thread is the default (the bits depend on it): a
    second one gains little on the tiny model and, when other processes hold the cores, spinning threads slowed it
    tenfold. Writes or1_init_report.json.
    """
    console = console or Console()
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise UserError(f"{out} already exists and is not empty; choose another --out or pass --overwrite.")
    if sft_steps < 1 or eval_samples < 1 or threads < 1:
        raise UserError("sft_steps, eval_samples and threads must each be at least 1.")
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    hf_logging.disable_progress_bar()  # its tqdm bars for one tiny shard would clutter the rich output
    start, cpu_start = time.perf_counter(), time.process_time()
    try:
        out.mkdir(parents=True, exist_ok=True)
        built = _build_pinned(out, seed, SFTConfig(steps=sft_steps, batch_size=batch_size, lr=lr), threads)
        sft = SFTReport(**{**built["sft"], "first_losses": tuple(built["sft"]["first_losses"])})
        tokenizer = load_tokenizer(out)
        rate, code_rate = (
            validation_solve_rate(
                out, samples=eval_samples, max_response_length=eval_max_new_tokens, seed=seed, ability=ability
            )
            for ability in ("math", "code")
        )
        report = InitReport(
            out_dir=str(out),
            seed=seed,
            parameters=built["parameters"],
            vocab_size=len(tokenizer),
            sft=sft,
            solve_rate=rate,
            code_solve_rate=code_rate,
            gold_lengths=gold_length_stats(tokenizer, seed),
            prompt_length_max=max(
                len(prompt_ids(tokenizer, list(r["prompt"]))) for r in math_validation_rows()
            ),
            seconds=time.perf_counter() - start,
            cpu_seconds=time.process_time() - cpu_start + built["cpu_seconds"],
            threads=threads,
            settings={
                "sft_steps": sft_steps,
                "batch_size": batch_size,
                "lr": lr,
                "eval_samples": eval_samples,
                "eval_max_new_tokens": eval_max_new_tokens,
                "spec": asdict(TinyModelSpec()),
                "kernels": {**PINNED_KERNELS, "torch_cpu_capability": built["capability"]},
                "data_sha256": sft_data_sha256(
                    seed, SFTConfig(steps=sft_steps, batch_size=batch_size, lr=lr)
                ),
            },
            machine=machine_description(),
            files=file_hashes(out),
        )
    finally:
        torch.set_num_threads(previous_threads)
        hf_logging.enable_progress_bar()
    (out / REPORT_FILE).write_text(json.dumps(asdict(report), indent=2) + "\n")
    print_report(console, report, out)
    return report


def machine_description() -> dict:
    """The processor (lscpu's model name, vendor, flags) and torch's version and kernel level of this process."""
    info: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            info.setdefault(key.strip(), value.strip())
    return {
        "cpu": info.get("model name") or platform.processor() or platform.machine(),
        "vendor": info.get("vendor_id", ""),
        "flags": info.get("flags", "").split(),
        "torch": torch.__version__,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def file_hashes(folder: Path) -> dict[str, str]:
    """sha256 of each file of a model folder, the init report excepted."""
    return {
        path.name: hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name != REPORT_FILE
    }


def sft_data_sha256(seed: int, cfg: SFTConfig) -> str:
    """A fingerprint of every batch the warm start trains on (its examples' text, in order)."""
    digest, batches = hashlib.sha256(), sft_examples(seed, cfg)
    for _ in range(cfg.steps):
        digest.update(json.dumps(next(batches)).encode())
    return digest.hexdigest()


_BUILT = ".or1_warm_start.json"  # what the child reports; removed once read


def _build_pinned(out: Path, seed: int, cfg: SFTConfig, threads: int) -> dict:
    """Tokenizer, model and warm start, saved to `out`, in a child process under PINNED_KERNELS; returns its
    SFTReport fields, the model's parameter count, its CPU seconds and the kernel level torch ran at."""
    env = {**os.environ, **PINNED_KERNELS}
    request = json.dumps({"out": str(out), "seed": seed, "cfg": asdict(cfg), "threads": threads})
    subprocess.run([sys.executable, "-m", "or1.tinyworld.init", request], env=env, check=True)
    report = out / _BUILT
    built = json.loads(report.read_text())
    report.unlink()
    return built


def _build_here(request: dict) -> None:
    """The child's side of _build_pinned."""
    torch.set_num_threads(request["threads"])
    hf_logging.disable_progress_bar()
    cpu_start, seed, out = time.process_time(), request["seed"], Path(request["out"])
    cfg = SFTConfig(**{**request["cfg"], "ops": tuple(request["cfg"]["ops"])})
    tokenizer = train_tokenizer(_tokenizer_corpus(seed))
    model = build_tiny_model(tokenizer, seed)
    sft = warm_start(model, tokenizer, seed, cfg, Console())
    model.config.__dict__[OR1_TINY_MARKER] = True  # lets load_tokenizer pick the explicit tokenizer path
    model.save_pretrained(out)
    tokenizer.save_pretrained(out, save_jinja_files=False)  # chat template inside tokenizer_config.json
    report = {
        "sft": asdict(sft),
        "parameters": count_parameters(model),
        "cpu_seconds": time.process_time() - cpu_start,
        "capability": torch.backends.cpu.get_cpu_capability(),
    }
    (out / _BUILT).write_text(json.dumps(report))


def _tokenizer_corpus(seed: int, size: int = 4000) -> list[str]:
    """Chat-formatted solved problems and programs (one in four): the text the tiny model reads and writes."""
    math = itertools.islice(problem_stream(seed, range(2, 7)), size - size // 4)
    code = itertools.islice(task_stream(seed, CODE_SFT_STEPS), size // 4)
    pairs = [(p.prompt, p.solution) for p in math] + [(t.prompt, t.response) for t in code]
    return [f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n" for q, a in pairs]


def gold_length_stats(
    tokenizer: PreTrainedTokenizerBase, seed: int, per_ops: int = 500
) -> dict[int, LengthStats]:
    """Gold response lengths in tokens (eos included) per operand count 2..6, from `per_ops` sampled problems each."""
    stats = {}
    for num_ops in range(2, 7):
        problems = itertools.islice(problem_stream(seed + num_ops, [num_ops], exclude=set()), per_ops)
        lengths = [
            len(tokenizer(p.solution + tokenizer.eos_token, add_special_tokens=False)["input_ids"])
            for p in problems
        ]
        stats[num_ops] = LengthStats(mean=round(statistics.mean(lengths), 1), max=max(lengths))
    return stats


def print_report(console: Console, report: InitReport, folder: str | Path) -> None:
    """The report as a table of rates and gold lengths per difficulty, and one closing line."""
    rate, code = report.solve_rate, report.code_solve_rate
    table = Table(title=f"tiny base model: {folder}")
    for column in ("operands / steps", "math solve rate", "math gold tokens mean / max", "code pass rate"):
        table.add_column(column)
    for n, stats in report.gold_lengths.items():
        solved = f"{rate.by_difficulty[n]:.1%}" if n in rate.by_difficulty else "-"
        passed = f"{code.by_difficulty[n]:.1%}" if n in code.by_difficulty else "-"
        table.add_row(str(n), solved, f"{stats.mean} / {stats.max}", passed)
    table.add_row("all", f"{rate.overall:.1%}", "", f"{code.overall:.1%}")
    console.print(table)
    console.print(
        f"{report.parameters / 1e6:.2f}M parameters, vocabulary {report.vocab_size}; warm start {report.sft.steps} "
        f"steps in {report.sft.seconds:.0f} s (loss {report.sft.final_loss:.3f}); base at T=1.0: math "
        f"[bold]{rate.overall:.1%}[/bold] ({rate.samples_per_problem} samples x {rate.problems} problems, "
        f"{rate.truncated:.1%} truncated), code [bold]{code.overall:.1%}[/bold] ({code.samples_per_problem} x "
        f"{code.problems}, {code.truncated:.1%} truncated); total {report.seconds:.0f} s ({report.cpu_seconds:.0f} s "
        f"CPU) on {report.threads} thread(s)."
    )


if __name__ == "__main__":  # the pinned child of _build_pinned
    _build_here(json.loads(sys.argv[1]))
