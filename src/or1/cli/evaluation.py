"""`or1 score`, `or1 eval`, `or1 report` and `or1 export`: responses scored, a model evaluated, a run or evaluations
reported, a stage's model exported."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from or1.cli import Command, Flag, OverwriteOpt, app, err_console, examples, renamed, user_errors
from or1.errors import UserError


@app.command(
    cls=Command,
    epilog=examples(
        "or1 score responses.jsonl --out scored.jsonl",
        "or1 score responses.parquet --out scored.parquet --workers 8 --math-timeout 10",
    ),
)
@user_errors
def score(
    input: Annotated[Path, typer.Argument(help="jsonl or parquet of or1 rows with a `response` field.")],
    out: Annotated[
        Path | None, typer.Option(help="Where to write the scored rows (jsonl / parquet); required.")
    ] = None,
    workers: Annotated[int, typer.Option(help="Parallel verifier processes / sandbox slots.")] = 2,
    math_timeout: Annotated[float, typer.Option(help="Seconds per math verification (hard limit).")] = 5.0,
    code_timeout: Annotated[float, typer.Option(help="Seconds per code test (hard limit).")] = 6.0,
    output: Annotated[Path | None, typer.Option("--output", "-o", hidden=True)] = None,  # old name of --out
    timeout: Annotated[float | None, typer.Option("--timeout", hidden=True)] = None,  # old --math-timeout
) -> None:
    """Score responses: math by answer verification, code by running its tests in the sandbox."""
    from or1.rewards.score_file import format_summary, score_file

    out = out or renamed("--output", "--out", output)
    if out is None:
        raise UserError("or1 score needs --out FILE: where to write the scored rows (.jsonl or .parquet).")
    if timeout is not None:
        math_timeout = renamed("--timeout", "--math-timeout", timeout)
    summary = score_file(input, out, workers=workers, timeout=math_timeout, code_timeout=code_timeout)
    for warning in summary["warnings"]:
        err_console.print(
            f"warning: {warning}", style="yellow", highlight=False, soft_wrap=True, markup=False
        )
    err_console.print(format_summary(summary), highlight=False, soft_wrap=True, markup=False)


@app.command(
    "eval",
    cls=Command,
    epilog=examples(
        "or1 eval aime24 --model runs/or1-7b/stage2/final --n 8",
        "or1 eval tiny/data/validation.parquet --model tiny/model --limit 4",
    ),
)
@user_errors
def eval_command(
    benchmark: Annotated[
        str, typer.Argument(help="aime24, aime25, math500, amc, livecodebench, or an or1-row file.")
    ],
    model: Annotated[
        Path, typer.Option(help="Model to evaluate: a Hugging Face folder or a hub id (owner/name).")
    ],
    n: Annotated[
        int | None, typer.Option("--n", help="Samples per problem (default: the protocol's).")
    ] = None,
    protocol: Annotated[str, typer.Option(help="skywork, skywork-7b-script or deepseek-r1.")] = "skywork",
    temperature: Annotated[float | None, typer.Option(help="Override the protocol's temperature.")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p", help="Override the protocol's top_p.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Override the protocol's response budget.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(help="Local file of the benchmark (else its file under $OR1_BENCHMARKS, else the hub)."),
    ] = None,
    engine: Annotated[str, typer.Option(help="hf (CPU or GPU) or vllm (GPU, the vllm extra).")] = "hf",
    replicas: Annotated[
        int | None,
        typer.Option(help="Engine replicas (default: GPUs / tensor parallelism, or one per CPU core)."),
    ] = None,
    tensor_parallel_size: Annotated[
        int, typer.Option("--tensor-parallel-size", help="Devices per replica (vllm only).")
    ] = 1,
    ray_address: Annotated[
        str | None,
        typer.Option("--ray-address", help="Join this Ray cluster (default: a private local Ray)."),
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output folder (default under runs/).")] = None,
    seed: Annotated[int, typer.Option(help="Sampling and bootstrap seed.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Evaluate only the first N problems.")] = None,
    workers: Annotated[int, typer.Option(help="Verifier processes / sandbox slots.")] = 2,
    overwrite: Annotated[
        bool,
        OverwriteOpt(
            help="Start over in --out: discard its cached samples (needed when settings changed) and replace a "
            "complete evaluation there, also by a smaller one.",
        ),
    ] = False,
    fresh: Annotated[bool, Flag("--fresh", hidden=True)] = False,  # the old name of --overwrite
) -> None:
    """Evaluate a model under a named protocol; resumes from cached samples after an interruption.

    One engine replica per device (or per CPU core); each sample has its own seed, so the layout never changes the
    samples. Ctrl-C (or SIGTERM) saves the batches in progress and stops; rerun the same command to continue.
    """
    from or1.preflight import check_model, check_output_folder

    model = check_model(model, "--model")  # a hub id becomes its folder in the Hugging Face cache
    if out is not None:
        check_output_folder(out, "--out")
    from or1.eval.evaluate import run_eval

    folder = run_eval(
        benchmark,
        model=model,
        n=n,
        protocol=protocol,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        data=data,
        engine=engine,
        out=out,
        seed=seed,
        max_problems=limit,
        workers=workers,
        overwrite=overwrite or renamed("--fresh", "--overwrite", fresh),
        replicas=replicas,
        tensor_parallel_size=tensor_parallel_size,
        ray_address=ray_address,
    )
    from or1.eval.results import headline

    console = Console(soft_wrap=True, highlight=False)  # paths stay whole on one line
    for line in headline(folder):
        console.print(line, markup=False)


@app.command(
    "report",
    cls=Command,
    epilog=examples("or1 report runs/tiny", "or1 report runs/tiny/eval/base runs/tiny/eval/final"),
)
@user_errors
def report_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of or1 train (runs/<recipe> by default).")],
    other: Annotated[
        Path | None,
        typer.Argument(
            help="With two or1 eval output folders (or summary.json files): compare them instead."
        ),
    ] = None,
) -> None:
    """Draw a run's curves into RUN_DIR/plots/*.png and RUN_DIR/report.md (also on a run still going).

    Given two evaluations, say whether they can be compared (same data, protocol, sampling settings, engine and
    its version, dtype) and which settings differ, then their estimates side by side; exit 1 when they cannot.
    """
    console = Console(soft_wrap=True, highlight=False)  # paths stay whole on one line
    if other is not None:
        from or1.report.compare import compare_lines

        comparable, lines = compare_lines(run_dir, other)
        for line in lines:
            console.print(line, markup=False)
        if not comparable:
            raise typer.Exit(1)
        return
    from or1.report import write_report

    report = write_report(run_dir)
    console.print(
        f"wrote {report.markdown} and {len(report.figures)} figures in {report.markdown.parent}/plots"
    )
    if report.missing:
        console.print(f"nothing logged yet for: {', '.join(report.missing)}")
    for line in report.gains:
        console.print(line)


@app.command(
    "export",
    cls=Command,
    epilog=examples(
        "or1 export runs/tiny --stage 3 --out exports/tiny",
        "or1 export runs/or1-7b --stage 1 --step 400 --out exports/or1-7b-s1-400 --dtype bfloat16",
    ),
)
@user_errors
def export_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of or1 train (runs/<recipe> by default).")],
    stage: Annotated[int, typer.Option("--stage", "-s", help="Stage number (1-based).")],
    out: Annotated[Path, typer.Option(help="The folder to write (renamed into place once checked).")],
    step: Annotated[
        int | None, typer.Option(help="A checkpoint's step; default: the stage's final model.")
    ] = None,
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    shard_size: Annotated[float, typer.Option(help="Largest safetensors shard, in GiB.")] = 5.0,
    vllm: Annotated[
        bool, Flag("--vllm/--no-vllm", help="Also load it with vLLM, where installed, and check it.")
    ] = True,
    overwrite: Annotated[bool, OverwriteOpt(help="Replace a folder already at --out.")] = False,
) -> None:
    """Write a stage's model (or a checkpoint's) as a checked Hugging Face folder: safetensors shards with their
    index, config, tokenizer, a model card and manifest.json; loaded back with transformers (and vLLM) and held to
    or1's own log-probs on a fixed probe before it is renamed into place (docs/export.md)."""
    from or1.export import export, find_source

    if shard_size <= 0:
        raise UserError(f"--shard-size {shard_size:g}: give a positive size in GiB")
    console = Console(soft_wrap=True, highlight=False)
    source = find_source(run_dir, stage, step)
    console.print(f"exporting {source.folder} (stage {stage}, step {source.step}) to {out} in {dtype}")
    manifest = export(
        source, out, dtype=dtype, shard_bytes=int(shard_size * 2**30), vllm=vllm, overwrite=overwrite
    )
    probe = manifest["probe"]
    vllm_check = probe["vllm"]
    if isinstance(vllm_check, dict):
        vllm_check = f"mean {vllm_check['mean_abs_diff']:.2g}"
    console.print(
        f"wrote {out} ({len(manifest['files'])} files); |log-prob difference| from or1's engine on a "
        f"{probe['tokens']}-token probe: transformers largest {probe['transformers']['max_abs_diff']:.2g}, "
        f"vLLM {vllm_check}"
    )
