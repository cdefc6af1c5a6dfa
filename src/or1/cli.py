"""The `or1` command line: each command is a thin call into the module that does the work."""

from __future__ import annotations

import functools
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperCommand, TyperGroup

from or1.errors import UserError
from or1.stop import Interrupted


class _PlainHelp:
    """--help without a type placeholder beside it (Typer shows `<bool>` for a flag)."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            option.metavar = ""
        return option


class Command(_PlainHelp, TyperCommand):
    pass


class Group(_PlainHelp, TyperGroup):
    pass


def examples(*lines: str) -> str:
    """A command's help epilog: its example command lines (tests/test_cli.py runs each with --help appended)."""
    return "Examples:\n\n" + "\n\n".join(lines)


app = typer.Typer(
    cls=Group,
    help="or1: Skywork-OR1 reasoning RL end to end: prepare data, train in stages, score, evaluate.",
    epilog=examples("or1 doctor", "or1 train --recipe stages/tiny.yaml --stage all"),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
config_app = typer.Typer(
    cls=Group,
    help="Inspect recipes.",
    epilog=examples("or1 config show --recipe stages/tiny.yaml --stage 2"),
    no_args_is_help=True,
)
app.add_typer(config_app, name="config")
sandbox_app = typer.Typer(
    cls=Group, help="The code-execution sandbox.", epilog=examples("or1 sandbox check"), no_args_is_help=True
)
app.add_typer(sandbox_app, name="sandbox")
err_console = Console(stderr=True)
Flag = functools.partial(typer.Option, metavar="")  # an on/off option: no `<bool>` placeholder in the help


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into one red line and exit code 2, and a stop on Ctrl-C / SIGTERM into one line saying how
    to resume and exit code 130 / 143; bugs keep their traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            # escape: a message may quote text in brackets, such as pip install 'or1[vllm]'
            err_console.print(f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except Interrupted as stop:
            err_console.print(
                f"[yellow]{escape(stop.what)}[/yellow]; to resume, run: {escape(rerun_command())}",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(stop.exit_code) from None
        except KeyboardInterrupt:
            # commands without a graceful stop write their output files whole or not at all (or1.atomic)
            err_console.print(
                "interrupted: finished output files are whole (each is written aside, then renamed); to start "
                f"again, run: {escape(rerun_command())}",
                style="yellow",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(130) from None

    return wrapper


def rerun_command() -> str:
    """This command line as typed, minus what would discard the saved work (--resume never, --overwrite, --fresh)."""
    args, out = sys.argv[1:], []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in ("--overwrite", "--fresh", "--resume=never"):
            continue
        elif arg == "--resume" and i + 1 < len(args) and args[i + 1] == "never":
            skip = True
        else:
            out.append(arg)
    return shlex.join(["or1", *out])


def renamed(old: str, new: str, value: Any) -> Any:
    """The value given under a flag's old name, with a one-line note naming the new one (None / False: not given)."""
    if value is not None and value is not False:
        err_console.print(f"note: {old} is now {new}", style="yellow", highlight=False, markup=False)
    return value


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"or1 {version('or1')}")
        except PackageNotFoundError:
            typer.echo("or1 (not installed as a package)")
        raise typer.Exit()


@app.callback()
def main_options(
    show_version: Annotated[
        bool,
        Flag("--version", callback=_version, is_eager=True, help="Print or1's version and exit."),
    ] = False,
) -> None:
    """or1: Skywork-OR1 reasoning RL end to end: prepare data, train in stages, score, evaluate."""


RecipeOpt = Annotated[
    str, typer.Option("--recipe", "-r", metavar="NAME|YAML", help="Recipe YAML path or name in stages/.")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Override a config key, e.g. --set trainer.steps=2; repeat it for more keys.",
    ),
]
OverwriteOpt = functools.partial(Flag, "--overwrite")
GPUS_HELP = (
    "GPUs per node and their memory, e.g. 8xH100-80GB (a known card: the memory it gives to PyTorch) or 8x79.1 "
    "(GiB per GPU)"
)


PresetOpt = Annotated[str, typer.Option(help="Which world to build; only `tiny` (offline, CPU) exists.")]


def _check_preset(preset: str) -> None:
    if preset != "tiny":
        raise UserError(f"unknown preset {preset!r}: the only preset is tiny")


@app.command(
    "init-model",
    cls=Command,
    epilog=examples("or1 init-model --out tiny/model", "or1 init-model --out tiny/model-seed1 --seed 1"),
)
@user_errors
def init_model(
    out: Annotated[Path, typer.Option(help="Folder for the Hugging Face model (safetensors + tokenizer).")],
    preset: PresetOpt = "tiny",
    rebuild: Annotated[
        bool,
        Flag(
            "--rebuild", help="Train the base again on this machine (about 7 min) instead of the shipped one."
        ),
    ] = False,
    seed: Annotated[
        int, typer.Option(help="Seed of the tokenizer corpus, weights and SFT data (builds).")
    ] = 0,
    sft_steps: Annotated[
        int, typer.Option(help="Warm-start SFT steps (builds; more steps: a stronger base model).")
    ] = 600,  # seed and steps: the shipped base's (or1.tinyworld.shipped.SHIPPED_RECIPE)
    overwrite: Annotated[bool, OverwriteOpt(help="Replace an existing model folder.")] = False,
) -> None:
    """Write the tiny base model and print its solve rates.

    The base shipped with or1 (seed 0, 600 warm-start steps), or with --rebuild or another --seed / --sft-steps one
    trained here (tokenizer, Qwen2 model, SFT warm start)."""
    from or1.preflight import check_output_folder

    _check_preset(preset)
    check_output_folder(out, "--out")
    from or1.tinyworld.shipped import SHIPPED_RECIPE, compare_with_shipped, install_base

    if not rebuild and (seed, sft_steps) == SHIPPED_RECIPE:
        install_base(out, overwrite=overwrite)
        return
    from or1.tinyworld.init import init_tiny_model

    comparison = compare_with_shipped(init_tiny_model(out, seed, sft_steps=sft_steps, overwrite=overwrite))
    if comparison:
        typer.echo(comparison)


@app.command(
    "prepare-data",
    cls=Command,
    epilog=examples(
        "or1 prepare-data --preset tiny --out tiny/data", "or1 prepare-data --spec my-data.yaml --out my-data"
    ),
)
@user_errors
def prepare_data(
    out: Annotated[
        Path, typer.Option(help="Folder for the train / validation parquet files and the report.")
    ],
    spec: Annotated[
        str | None, typer.Option(help="Data spec: a YAML path or a name in data/ (e.g. or1-math).")
    ] = None,
    preset: Annotated[str | None, typer.Option(help="Shortcut for --spec data/<preset>.yaml (tiny).")] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Without a spec: seed of the tiny training tasks, written without grading."),
    ] = None,
    overwrite: Annotated[bool, OverwriteOpt(help="Replace data files already in --out.")] = False,
    ray_address: Annotated[
        str | None,
        typer.Option(help="Run the difficulty step on this Ray cluster (e.g. auto); default: local."),
    ] = None,
) -> None:
    """Build a training set from a data spec: adapt, filter, deduplicate, decontaminate, grade; report every drop."""
    if seed is not None and spec is None:  # the synthetic tiny files alone, as before specs existed
        from or1.data.synthetic import write_tiny_dataset

        _check_preset(preset or "tiny")
        write_tiny_dataset(out, seed, overwrite=overwrite)
        return
    from or1.prepare.pipeline import prepare

    if spec is not None and preset is not None:
        raise UserError("give --spec or --preset, not both.")
    if spec is None:
        _check_preset(preset or "tiny")
    prepare(spec or preset or "tiny", out, ray_address=ray_address, overwrite=overwrite)


@config_app.command(
    "show",
    cls=Command,
    epilog=examples(
        "or1 config show --recipe stages/tiny.yaml --stage 2",
        "or1 config show --recipe or1-7b --set trainer.steps=10",
    ),
)
@user_errors
def config_show(
    recipe: RecipeOpt,
    stage: Annotated[str, typer.Option("--stage", "-s", help="Stage number (1-based) or name.")] = "1",
    overrides: SetOpt = None,
) -> None:
    """Print the fully resolved config of one stage of a recipe."""
    from or1.config.recipe import dump, resolve

    sys.stdout.write(dump(resolve(recipe, stage, overrides or [])))


@app.command(
    cls=Command,
    epilog=examples(
        "or1 train --recipe stages/tiny.yaml --stage all",
        "or1 train --recipe my-recipe.yaml --set model.path=Qwen/Qwen2.5-0.5B-Instruct --set trainer.steps=100",
    ),
)
@user_errors
def train(
    recipe: RecipeOpt,
    stage: Annotated[str, typer.Option("--stage", "-s", help="Stage number (1-based), name, or all.")] = "1",
    run_dir: Annotated[Path | None, typer.Option(help="Run directory (default runs/<recipe name>).")] = None,
    overrides: SetOpt = None,
    resume: Annotated[
        str, typer.Option(help="auto: continue from the newest complete checkpoint; never.")
    ] = "auto",
    ray_address: Annotated[
        str | None, typer.Option(help="Join this Ray cluster (e.g. auto); default: local.")
    ] = None,
    overwrite: Annotated[
        bool, OverwriteOpt(help="With --resume never: delete the stage's earlier results first.")
    ] = False,
    allow_config_change: Annotated[
        bool,
        Flag(
            "--allow-config-change",
            help="Resume even though settings differ from the stage's saved config.yaml.",
        ),
    ] = False,
    gpus: Annotated[
        str | None,
        typer.Option(
            help=f"Plan the memory check for these GPUs, as or1 plan --gpus: {GPUS_HELP} (default: the visible GPU)."
        ),
    ] = None,
    gpu_memory: Annotated[
        float | None, typer.Option("--gpu-memory", hidden=True)
    ] = None,  # old name of --gpus
    plan_check: Annotated[
        bool, Flag(help="Refuse a stage whose planned GPU memory exceeds the GPU's (or1 plan).")
    ] = True,
) -> None:
    """Train a stage of a recipe (or all remaining ones) with GRPO / MAGIC: Ray worker groups, FSDP2.

    Ctrl-C (or SIGTERM) stops after the current step with a checkpoint; rerun the same command to resume.
    """
    from or1.trainer.launch import launch
    from or1.trainer.request import TrainRequest

    if gpu_memory is not None:  # the old --gpu-memory GIB: that many GiB per GPU, which --gpus GIB says too
        gpus = gpus or f"{renamed('--gpu-memory', '--gpus', gpu_memory):g}"

    launch(
        TrainRequest(
            recipe,
            stage,
            run_dir,
            tuple(overrides or ()),
            resume,
            ray_address,
            overwrite=overwrite,
            allow_config_change=allow_config_change,
            gpus=gpus,
            plan_check=plan_check,
        )
    )


@app.command(
    "plan",
    cls=Command,
    epilog=examples(
        "or1 plan --recipe or1-7b --gpus 8xH100-80GB",
        "or1 plan --recipe my-recipe.yaml --stage 1 --gpus 1x24",
    ),
)
@user_errors
def plan_command(
    recipe: RecipeOpt,
    stage: Annotated[
        str, typer.Option("--stage", "-s", help="Stage number (1-based), name, or all.")
    ] = "all",
    gpus: Annotated[
        str | None,
        typer.Option(
            help=f"{GPUS_HELP} (default: the visible GPU's memory, else 80 GiB, times the recipe's devices_per_node)."
        ),
    ] = None,
    nodes: Annotated[int | None, typer.Option(help="Nodes (default: the recipe's trainer.nnodes).")] = None,
    model_config: Annotated[
        Path | None,
        typer.Option(
            help="The model's config.json (default: model.path's, from its folder or the HF cache)."
        ),
    ] = None,
    run_dir: Annotated[
        Path | None,
        typer.Option(
            help="A run folder whose stages' mean response lengths are the next stages' expected lengths "
            "(when rollout.expected_response_length is not set)."
        ),
    ] = None,
    host_memory: Annotated[
        float | None,
        typer.Option(help="A node's host memory in GiB: checked against what offload and loading put there."),
    ] = None,
    overrides: SetOpt = None,
) -> None:
    """Will a recipe fit: per-GPU memory of each phase of each stage, and the smallest change that makes it fit.

    Each phase at the worst case and at the expected response lengths, and a node's host memory."""
    from or1.plan.report import plan_recipe

    typer.echo(
        plan_recipe(
            recipe,
            stage,
            overrides or [],
            gpus=gpus,
            nodes=nodes,
            model_config=model_config,
            run_dir=run_dir,
            host_memory_gib=host_memory,
        )
    )


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


@sandbox_app.command(
    "check", cls=Command, epilog=examples("or1 sandbox check", "or1 sandbox check --backend docker")
)
@user_errors
def sandbox_check(
    backend: Annotated[
        str, typer.Option(help="local (bubblewrap + rlimits) or docker (DOCKER_HOST engine).")
    ] = "local",
) -> None:
    """Self-test the sandbox: positive controls and hostile programs; exit 1 if any isolation check fails."""
    from or1.rewards.code import judge_probes
    from or1.sandbox.check import run_self_test

    if backend not in ("local", "docker"):
        raise UserError(f"unknown sandbox backend {backend!r}: use local or docker")
    results = run_self_test(judge_probes, backend)
    table = Table("check", "result", "detail")
    for check in results:
        table.add_row(check.name, "[green]pass[/green]" if check.passed else "[red]FAIL[/red]", check.detail)
    Console().print(table)
    failed = [c.name for c in results if not c.passed]
    if failed:
        err_console.print(
            f"[red]{len(failed)} of {len(results)} sandbox checks failed:[/red] {', '.join(failed)}"
        )
        raise typer.Exit(1)
    Console().print(f"all {len(results)} sandbox checks passed on the {backend} backend")


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


@app.command(cls=Command, epilog=examples("or1 doctor"))
def doctor() -> None:
    """What this machine can run: Python, torch, CUDA, vLLM, Ray, bubblewrap, Docker, and a verdict."""
    from or1.doctor import run_checks, verdict

    checks = run_checks()
    table = Table("component", "status", "found", "what it is for")
    for check in checks:
        table.add_row(
            check.name,
            "[green]ok[/green]" if check.ok else "[yellow]missing[/yellow]",
            check.found,
            check.meaning,
        )
    console = Console()
    console.print(table)
    console.print(verdict(checks), markup=False, highlight=False, soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
