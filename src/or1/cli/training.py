"""`or1 train`, `or1 plan` and `or1 config show`: a recipe's stages trained, planned for memory, or shown resolved."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from or1.cli import Command, Flag, OverwriteOpt, app, config_app, examples, renamed, user_errors

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
GPUS_HELP = (
    "GPUs per node and their memory, e.g. 8xH100-80GB (a known card: the memory it gives to PyTorch) or 8x79.1 "
    "(GiB per GPU)"
)


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
