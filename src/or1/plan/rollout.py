"""The vLLM engine's phases: beside the actor on a training rank (start, weight push, generation), or as a replica of
the separate placement on GPUs of its own; and whether its KV cache holds a full-length sequence.

vLLM (0.21 and later; or1 takes 0.32 and later) sizes its CUDA graphs (`CUDA_GRAPHS`) before its KV cache and takes
them out of its gpu_memory_utilization share: they cost KV cache, not memory beyond the share, while the engine is
awake (asleep, they wait on the host with its weights); rollout.enforce_eager captures none.
"""

from __future__ import annotations

import math

from or1.config.schema import RunConfig
from or1.plan import memory
from or1.plan.device import Device
from or1.plan.memory import GIB, ShardState
from or1.plan.model import ModelShape
from or1.plan.phase import CUDA_CONTEXT, NCCL_BUFFERS, Phase

# vLLM's CUDA graphs of the decode batch sizes: profiled before the KV cache is sized and subtracted from the share
# (vllm/v1/worker/gpu_worker.py `determine_available_memory`, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS on by default
# since 0.21), kept on the GPU whenever any of the engine is awake (`wake_up` restores the "cudagraph" pool with any
# tag). Their size as vLLM's profiler reads it on an H100: 0.10 GiB for Qwen3-0.6B, 0.39 for gpt-oss-20b, 1.03 for
# gpt-oss-120b (llm-d/llm-d-benchmark config_explorer/empirical-vllm-memory-results.md): 1 GiB planned.
CUDA_GRAPHS = GIB
# vLLM's offline defaults on GPUs of 70 GiB and more (engine/arg_utils), below that 8192 tokens and 256 sequences
BATCHED_TOKENS = {True: 16384, False: 8192}
MAX_SEQUENCES = {True: 1024, False: 256}


def graphs_bytes(cfg: RunConfig) -> int:
    """What vLLM's CUDA graphs hold of its share while the engine is awake: none under rollout.enforce_eager."""
    return 0 if cfg.rollout.enforce_eager else CUDA_GRAPHS


def rollout_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, shards: ShardState, c: int, ref: int
) -> tuple[list[Phase], list[str], list[str]]:
    """vLLM's start (its share beside the actor's parameters, before any offload: vLLM refuses to start when the
    GPU's free memory is below its share), the weight push (engine weights and CUDA graphs awake, the actor still
    on the GPU, one unit gathered and copied) and the generation (vLLM's share of the GPU, plus whatever of the actor
    and the reference (`ref`) stays there). Returns the phases, notes and problems."""
    r, a = cfg.rollout, cfg.actor
    engine = int(r.gpu_memory_utilization * device.memory)
    weights, workspace, graphs, kv = engine_parts(cfg, shape, device, c)
    host = a.fsdp_cpu_offload
    resident = 0 if host else shards.parameters + shards.optimizer
    unit = max(shape.root_parameters, shape.layer_parameters) * c
    outside = {"context": CUDA_CONTEXT, "nccl": NCCL_BUFFERS}
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
            "graphs": graphs,
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
            "graphs": graphs,
            "kv cache": kv,
            **outside,
        },
    )
    notes, problems = engine_check(
        cfg, shape, kv, c, cfg.trainer.nnodes * device.count // r.tensor_parallel_size
    )
    return [start, push, generate], notes, problems


def engine_parts(cfg: RunConfig, shape: ModelShape, device: Device, c: int) -> tuple[int, int, int, int]:
    """One vLLM engine's per-GPU weights, workspace, CUDA graphs and KV cache (what is left of its
    gpu_memory_utilization share)."""
    weights, workspace = engine_weights(shape, cfg.rollout.tensor_parallel_size, device, c)
    graphs = graphs_bytes(cfg)
    share = int(cfg.rollout.gpu_memory_utilization * device.memory)
    return weights, workspace, graphs, max(0, share - weights - workspace - graphs)


def engine_weights(shape: ModelShape, tp: int, device: Device, c: int) -> tuple[int, int]:
    """One tensor-parallel rank's vLLM weights and its profiled workspace (vLLM's offline defaults for the GPU's
    size)."""
    large = device.memory >= 70 * GIB
    weights = memory.rollout_weight_bytes(shape, tp, c)
    return weights, memory.rollout_workspace_bytes(shape, tp, c, BATCHED_TOKENS[large], MAX_SEQUENCES[large])


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
    CUDA graphs, KV cache), nothing of the actor; a problem when the placement asks for more GPUs than the nodes
    have."""
    r = cfg.rollout
    weights, workspace, graphs, kv = engine_parts(cfg, shape, device, c)
    replica = Phase(
        "rollout replica",
        {
            "vllm weights": weights,
            "vllm workspace": workspace,
            "graphs": graphs,
            "kv cache": kv,
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
