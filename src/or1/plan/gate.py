"""`or1 train`'s memory check: plan the stage on this machine's GPUs and refuse one that cannot fit, in one line.

Runs before Ray or any worker starts. The GPU size is the override when given (`--gpu-memory`), else the first
visible CUDA device's; with neither (a CPU run), nothing is checked. The model's numbers come from its config.json
on this machine (a folder or the Hugging Face cache); a hub model not yet downloaded is not checked here.
"""

from __future__ import annotations

from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.plan.advice import smallest_fix
from or1.plan.memory import GIB
from or1.plan.model import ModelShape, config_file, read_model_shape
from or1.plan.stage import Device, StagePlan, plan_stage
from or1.plan.table import one_line


def gpu_device(cfg: RunConfig, gpu_memory_gib: float | None) -> Device | None:
    """The node's GPUs for the plan: the recipe's count with the given size, or the visible CUDA device's size."""
    if gpu_memory_gib is not None:
        return Device(cfg.trainer.devices_per_node, int(gpu_memory_gib * GIB), "GPU")
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(0)
    return Device(cfg.trainer.devices_per_node, int(props.total_memory), props.name.replace(" ", "-"))


def model_shape(cfg: RunConfig) -> ModelShape | None:
    """The stage's model shape when its config.json is on this machine (later stages share stage 1's shape)."""
    return read_model_shape(cfg.model.path) if config_file(cfg.model.path) is not None else None


def check_fits(cfg: RunConfig, gpu_memory_gib: float | None = None) -> StagePlan | None:
    """The stage's plan when one could be made; a UserError when it does not fit."""
    device = gpu_device(cfg, gpu_memory_gib)
    shape = model_shape(cfg) if device is not None else None
    if device is None or shape is None:
        return None
    plan = plan_stage(cfg, shape, device)
    if not plan.fits:
        raise UserError(one_line(plan, smallest_fix(cfg, shape, device)))
    return plan
