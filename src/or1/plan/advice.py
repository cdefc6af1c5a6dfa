"""The smallest change of settings that makes a stage fit, as `--set` overrides.

Changes are tried from the cheapest (the fused output head, a smaller micro-batch token budget, activation checkpointing,
activation offload, vLLM without CUDA graphs) to the dearest
(sequence parallelism, vLLM tensor parallelism, FSDP2 CPU offload, more nodes); the first combination that fits
wins, with the largest token budget that still fits, so the answer costs the least speed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from or1.config.schema import RunConfig
from or1.plan.model import ModelShape
from or1.plan.stage import Device, StagePlan, plan_stage

BUDGET_STEP = 1024  # token budgets are proposed in multiples of this
SP_SIZES = (1, 2, 4, 8)
TP_SIZES = (1, 2, 4, 8)
UTILIZATIONS = (0.4, 0.5, 0.6, 0.7, 0.8, 0.9)


@dataclass(frozen=True)
class Advice:
    """Overrides (`section.key` -> value) and the plan they give."""

    overrides: dict[str, Any]
    plan: StagePlan

    @property
    def sets(self) -> list[str]:
        return [f"{key}={_text(value)}" for key, value in self.overrides.items()]


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def with_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """A copy of `cfg` with `section.key` values set (validated by the schema)."""
    out = cfg.model_copy(deep=True)
    for key, value in overrides.items():
        section, name = key.split(".", 1)
        setattr(getattr(out, section), name, value)
    return out


def smallest_fix(cfg: RunConfig, shape: ModelShape, device: Device) -> Advice | None:
    """The cheapest overrides under which every phase fits (None when nothing tried fits)."""
    for changes in _candidates(cfg, shape, device):
        advice = _with_budget(cfg, shape, device, changes)
        if advice is not None:
            return advice
    return None


def _candidates(cfg: RunConfig, shape: ModelShape, device: Device):
    """Change sets ordered by cost: each knob's options, cheapest first, combined in order of total cost."""
    a, r, t = cfg.actor, cfg.rollout, cfg.trainer
    knobs: list[list[tuple[int, dict[str, Any]]]] = [
        [(0, {})]
        + ([(1, {"actor.fused_head": True})] if not a.fused_head else []),  # a head matmul recomputed
        [(0, {})]
        + ([(1, {"model.gradient_checkpointing": True})] if not cfg.model.gradient_checkpointing else []),
        [(0, {})] + ([(1, {"actor.offload": True})] if not a.offload and r.engine == "vllm" else []),
        # no CUDA graphs: their part of vLLM's share goes to the KV cache; slower decoding of small batches
        [(0, {})]
        + ([(2, {"rollout.enforce_eager": True})] if not r.enforce_eager and r.engine == "vllm" else []),
        # the blocks' inputs on the host: a copy each way per block (needs checkpointing, merged in if off)
        [(0, {})]
        + (
            [(2, {"actor.activation_offload": True, "model.gradient_checkpointing": True})]
            if not a.activation_offload
            else []
        ),
        [(0, {})]
        + [
            (1 + round(abs(u - r.gpu_memory_utilization) * 10), {"rollout.gpu_memory_utilization": u})
            for u in UTILIZATIONS
            if r.engine == "vllm" and u != r.gpu_memory_utilization
        ],
        [(0, {})]
        + [
            (2 * i, {"actor.sequence_parallel_size": sp})
            for i, sp in enumerate(SP_SIZES)
            if sp > a.sequence_parallel_size and _splits(shape, sp, device.count * t.nnodes)
        ],
        [(0, {})]
        + [
            (2 * i, {"rollout.tensor_parallel_size": tp})
            for i, tp in enumerate(TP_SIZES)
            if r.engine == "vllm" and tp > r.tensor_parallel_size and _tp_ok(shape, tp, device.count)
        ],
        [(0, {})] + ([(4, {"actor.fsdp_cpu_offload": True})] if not a.fsdp_cpu_offload else []),
        [(0, {})] + [(6 * k, {"trainer.nnodes": t.nnodes * 2**k}) for k in (1, 2)],
    ]
    combos = [
        (sum(cost for cost, _ in choice), {k: v for _, change in choice for k, v in change.items()})
        for choice in itertools.product(*knobs)
    ]
    combos.sort(key=lambda item: (item[0], len(item[1])))
    return [changes for _, changes in combos]


def _splits(shape: ModelShape, sp: int, world: int) -> bool:
    """Ulysses needs sp to divide the world and the heads, and key/value heads and sp to divide one another."""
    kv = shape.kv_heads
    return world % sp == 0 and shape.heads % sp == 0 and (kv % sp == 0 or sp % kv == 0)


def _tp_ok(shape: ModelShape, tp: int, per_node: int) -> bool:
    return per_node % tp == 0 and shape.heads % tp == 0


def _with_budget(cfg: RunConfig, shape: ModelShape, device: Device, changes: dict[str, Any]) -> Advice | None:
    """`changes` as they are when they fit; else with packing and the largest token budget that fits, if any."""
    changed = with_overrides(cfg, changes)
    plan = plan_stage(changed, shape, device)
    if plan.fits:
        return Advice(changes, plan)
    seq = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    smallest = -(-seq // changed.actor.sequence_parallel_size)  # one sequence alone over its group
    low = -(-smallest // BUDGET_STEP)
    packing = {"actor.remove_padding": True} if not changed.actor.remove_padding else {}
    trial = dict(changes) | packing | {"actor.max_tokens_per_micro_batch": low * BUDGET_STEP}
    plan = plan_stage(with_overrides(cfg, trial), shape, device)
    if not plan.fits:
        return None
    high = max(low, 8 * seq // BUDGET_STEP)  # nothing gains from a micro-batch of more than 8 sequences
    best = (low, plan)
    while low < high:  # the peak grows with the budget: the largest budget that fits
        mid = (low + high + 1) // 2
        trial["actor.max_tokens_per_micro_batch"] = mid * BUDGET_STEP
        plan = plan_stage(with_overrides(cfg, trial), shape, device)
        if plan.fits:
            low, best = mid, (mid, plan)
        else:
            high = mid - 1
    trial["actor.max_tokens_per_micro_batch"] = best[0] * BUDGET_STEP
    return Advice(trial, best[1])
