"""`or1 train`'s memory check: plan the stage on this machine's GPUs and refuse one that cannot fit, in one line.

Runs before Ray or any worker starts. The GPUs are the ones `--gpus` names (as `or1 plan --gpus`; the count per node
is the recipe's), else the first visible CUDA device. The model's numbers come from its config.json: a folder, the Hugging Face cache, or fetched
alone from the hub (a few KB). Never silent: a stage that cannot be checked (no GPU size, no config.json) or that
fits with less than a tenth of the GPU to spare, or only at the expected response lengths, gets one line saying so.
On the machine's own GPUs the node's host memory is checked too (offload, vLLM's sleep backups, the model's load).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.plan.advice import smallest_fix
from or1.plan.lengths import with_expected_length
from or1.plan.model import config_file, read_model_shape
from or1.plan.stage import Device, plan_stage
from or1.plan.table import one_line, tight_line


def gpu_device(cfg: RunConfig, gpus: str | None) -> Device | None:
    """The node's GPUs for the plan: the recipe's count of the GPUs `gpus` names (`Device.parse`), or of the
    visible CUDA device."""
    if gpus is not None:
        return dataclasses.replace(Device.parse(gpus), count=cfg.trainer.devices_per_node)
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return Device(
        cfg.trainer.devices_per_node,
        int(props.total_memory),
        props.name.replace(" ", "-"),
        host=host_memory(),
    )


def host_memory() -> int:
    """This machine's physical memory in bytes (the nodes of a run are taken to be alike)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(cfg: RunConfig, gpus: str | None = None, run_dir: Path | None = None) -> str | None:
    """A UserError when the stage does not fit; else a line to show when it could not be checked or fits above the
    warning band or only at the expected lengths (`StagePlan.tight`), None when it fits with room. `run_dir`: where
    the previous stage's response lengths are read (`plan.lengths`)."""
    stage = f"stage {cfg.stage.index}"
    device = gpu_device(cfg, gpus)
    if device is None:
        return (
            f"{stage}: GPU memory not checked: no CUDA device is visible here; pass --gpus (e.g. "
            "8xH100-80GB) to check it"
        )
    found = config_file(cfg.model.path, fetch=True)
    if found is None:
        return (
            f"{stage}: GPU memory not checked: no config.json for {cfg.model.path} (not a folder, not in the Hugging "
            "Face cache, and the hub could not be reached); check it with `or1 plan --model-config PATH`"
        )
    shape = read_model_shape(found)
    cfg, source = with_expected_length(cfg, run_dir)
    plan = plan_stage(cfg, shape, device, source)
    if not plan.fits:
        raise UserError(one_line(plan, smallest_fix(cfg, shape, device)))
    return tight_line(plan) if plan.tight else None
