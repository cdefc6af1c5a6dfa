"""The vLLM engine's phases: beside the actor on a training rank (start, weight push, generation), or as a replica of
the separate placement on GPUs of its own; and whether its KV cache holds a full-length sequence.

vLLM captures its CUDA graphs (`CUDA_GRAPHS`) outside its gpu_memory_utilization share: every phase the engine is
awake in holds them, unless rollout.enforce_eager captures none.
"""

from __future__ import annotations

import math

from or1.config.schema import RunConfig
from or1.plan import memory
from or1.plan.device import Device
from or1.plan.memory import GIB, ShardState
from or1.plan.model import ModelShape
from or1.plan.phase import CUDA_CONTEXT, NCCL_BUFFERS, Phase

# vLLM's CUDA graphs of the decode batch sizes, captured after it sizes its KV cache and held outside its
# gpu_memory_utilization share while the engine is awake (vllm-project/vllm#11251); vLLM logs their size ("Graph
# capturing finished ..., took X GiB"), and nvidia-smi with and without --enforce-eager read 2,464 MiB apart in
# vllm-project/vllm#7553: the larger published reading.
CUDA_GRAPHS = int(2.5 * GIB)
# vLLM's offline defaults on GPUs of 70 GiB and more (engine/arg_utils), below that 8192 tokens and 256 sequences
BATCHED_TOKENS = {True: 16384, False: 8192}
MAX_SEQUENCES = {True: 1024, False: 256}


def graphs_bytes(cfg: RunConfig) -> int:
    """What vLLM's CUDA graphs hold while the engine is awake: none under rollout.enforce_eager."""
    return 0 if cfg.rollout.enforce_eager else CUDA_GRAPHS


def rollout_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, shards: ShardState, c: int, ref: int
) -> tuple[list[Phase], list[str], list[str]]:
    """vLLM's start (beside the actor's parameters, before any offload), the weight push (engine weights awake,
    the actor still on the GPU, one unit gathered and copied) and the generation (vLLM's share of the GPU, its
    CUDA graphs, plus whatever of the actor and the reference (`ref`) stays there). Returns the phases, notes and
    problems."""
    r, a = cfg.rollout, cfg.actor
    engine = int(r.gpu_memory_utilization * device.memory)
    weights, workspace, kv = engine_parts(cfg, shape, device, c)
    host = a.fsdp_cpu_offload
    resident = 0 if host else shards.parameters + shards.optimizer
    unit = max(shape.root_parameters, shape.layer_parameters) * c
    outside = {"graphs": graphs_bytes(cfg), "context": CUDA_CONTEXT, "nccl": NCCL_BUFFERS}
    start = Phase(
        "vllm start",
        {"actor": 0 if host else shards.parameters, "vllm": engine, **outside},
    )
    push = Phase(
        "weight push",
        {
            "actor": resident,
            "ref": ref,
            "vllm weights": weights,
            "gathered": 2 * unit,
            **outside,
        },
    )
    generate = Phase(
        "rollout",
        {
            "actor": 0 if a.offload else resident,
            "ref": ref,
            "vllm weights": weights,
            "vllm workspace": workspace,
            "kv cache": kv,
            **outside,
        },
    )
    notes, problems = engine_check(
        cfg, shape, kv, c, cfg.trainer.nnodes * device.count // r.tensor_parallel_size
    )
    return [start, push, generate], notes, problems


def engine_parts(cfg: RunConfig, shape: ModelShape, device: Device, c: int) -> tuple[int, int, int]:
    """One vLLM engine's per-GPU weights, workspace and KV cache (what is left of its gpu_memory_utilization share)."""
    tp = cfg.rollout.tensor_parallel_size
    large = device.memory >= 70 * GIB
    weights = memory.rollout_weight_bytes(shape, tp, c)
    workspace = memory.rollout_workspace_bytes(shape, tp, c, BATCHED_TOKENS[large], MAX_SEQUENCES[large])
    share = int(cfg.rollout.gpu_memory_utilization * device.memory)
    return weights, workspace, max(0, share - weights - workspace)


def engine_check(
    cfg: RunConfig, shape: ModelShape, kv: int, c: int, engines: int
) -> tuple[list[str], list[str]]:
    """How many of an engine's sequences (the step's split over `engines`) its KV cache holds at full length, and a
    problem when not even one (vLLM refuses to start when one max_model_len sequence does not fit its cache)."""
    r = cfg.rollout
    per_token = memory.kv_bytes_per_token(shape, r.tensor_parallel_size, c)
    longest = cfg.data.max_prompt_length + max(
        r.max_response_length, cfg.data.validation.max_response_length or 0
    )
    held = kv // per_token
    sequences = math.ceil(cfg.trainer.batch_size * r.n / engines)
    notes = [
        f"KV cache {kv / GIB:.1f} GiB = {held:,} tokens ({per_token / 1024:.0f} KiB each): {held // longest} of "
        f"an engine's {sequences} sequences at full length ({longest:,} tokens) at once"
    ]
    problems = []
    if held < longest:
        problems.append(
            f"vLLM's KV cache ({kv / GIB:.1f} GiB of rollout.gpu_memory_utilization {r.gpu_memory_utilization:g}) "
            f"cannot hold one {longest:,}-token sequence ({longest * per_token / GIB:.1f} GiB)"
        )
    return notes, problems


def replica_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, c: int
) -> tuple[list[Phase], list[str], list[str]]:
    """A rollout replica of the separate placement on GPUs of its own: vLLM's share of the GPU (weights, workspace,
    KV cache) and its CUDA graphs, nothing of the actor; a problem when the placement asks for more GPUs than the
    nodes have."""
    r = cfg.rollout
    weights, workspace, kv = engine_parts(cfg, shape, device, c)
    replica = Phase(
        "rollout replica",
        {
            "vllm weights": weights,
            "vllm workspace": workspace,
            "kv cache": kv,
            "graphs": graphs_bytes(cfg),
            "context": CUDA_CONTEXT,
            "nccl": NCCL_BUFFERS,
        },
    )
    notes, problems = engine_check(cfg, shape, kv, c, r.replicas)
    needed = cfg.step_devices
    if needed > cfg.trainer.nnodes * device.count:
        problems.append(
            f"the separate placement needs {needed} GPUs (trainer.devices_per_node {cfg.trainer.devices_per_node} "
            f"x {cfg.trainer.nnodes} node(s) + rollout.replicas {r.replicas} x TP {r.tensor_parallel_size}), the "
            f"nodes have {cfg.trainer.nnodes * device.count}"
        )
    return [replica], notes, problems
