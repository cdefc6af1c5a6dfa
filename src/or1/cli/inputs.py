"""`or1 init-model` and `or1 prepare-data`: what training starts from, a base model and a data set."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from or1.cli import Command, Flag, OverwriteOpt, app, examples, user_errors
from or1.errors import UserError

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
