"""`or1 plan`: every stage of a recipe planned on the given GPUs, as tables with verdicts and fixes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from or1.config.recipe import load_recipe, resolve, stage_names
from or1.plan.advice import smallest_fix, with_overrides
from or1.plan.gate import gpu_device
from or1.plan.lengths import with_expected_length
from or1.plan.model import ModelShape, read_model_shape
from or1.plan.stage import Device, StagePlan, plan_stage
from or1.plan.table import format_stage

DEFAULT_GIB = 80.0  # without --gpus and without a visible GPU


def plan_recipe(
    recipe: str,
    stage: str,
    overrides: list[str],
    *,
    gpus: str | None = None,
    nodes: int | None = None,
    model_config: Path | None = None,
    run_dir: Path | None = None,
    host_memory_gib: float | None = None,
) -> str:
    """The tables of `stage` (or all stages) of `recipe`, one after the other; `run_dir`: a run whose stages' response
    lengths give the next stage's expected lengths; `host_memory_gib`: a node's host memory, checked when given."""
    first = resolve(recipe, "1" if stage == "all" else stage, overrides)
    device = Device.parse(gpus) if gpus else gpu_device(first, None)
    if device is None:
        device = Device(first.trainer.devices_per_node, int(DEFAULT_GIB * 2**30), "GPU")
    if host_memory_gib is not None:
        device = dataclasses.replace(device, host=int(host_memory_gib * 2**30))
    shape = read_model_shape(model_config or first.model.path)
    names = (
        [stage]
        if stage != "all"
        else [str(i) for i in range(1, len(stage_names(load_recipe(recipe)[1])) + 1)]
    )
    header = (
        f"{first.recipe}: {shape.name} ({shape.parameters / 1e9:.2f}B parameters, {shape.layers} layers, hidden "
        f"{shape.hidden}, {shape.heads}/{shape.kv_heads} heads, vocabulary {shape.vocab:,}) on "
        f"{nodes or first.trainer.nnodes} x {device.label}"
    )
    blocks = [header]
    for name in names:
        plan, advice = plan_one(resolve(recipe, name, overrides), shape, device, nodes, run_dir)
        blocks.append(format_stage(plan, advice))
    return "\n\n".join(blocks)


def plan_one(cfg, shape: ModelShape, device: Device, nodes: int | None = None, run_dir: Path | None = None):  # noqa: ANN001, ANN201
    """(plan, advice or None) of one resolved stage on `nodes` x `device` (nodes None: the recipe's)."""
    placement = {"trainer.nnodes": nodes or cfg.trainer.nnodes}
    if (
        cfg.rollout.placement == "colocated"
    ):  # every GPU trains; separate: the recipe splits them with the replicas
        placement["trainer.devices_per_node"] = device.count
    placed, source = with_expected_length(with_overrides(cfg, placement), run_dir)
    plan: StagePlan = plan_stage(placed, shape, device, source)
    return plan, None if plan.fits else smallest_fix(placed, shape, device)
