"""The per-GPU peak of each phase of one stage, in the order the colocated worker runs them.

A training rank holds the FSDP2 actor and a vLLM engine that take turns with the GPU (workers/weight_handoff
`rollout_phase`): the engine wakes its weights, the actor's weights are pushed into them, the actor goes to the host
(actor.offload), the KV cache wakes, the engine samples, then sleeps (weights to the host, KV dropped) and the
actor comes back for the old log-probs and the update. A stage fits when the largest of those phases fits; they are
never added up. What is not computed (CUDA context, NCCL buffers, allocator slack) is the fixed `RESERVED` margin.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from or1.config.schema import OptimConfig, RunConfig
from or1.errors import UserError
from or1.plan import memory
from or1.plan.memory import GIB, ShardState, Window
from or1.plan.model import BYTES, ModelShape

RESERVED = 2 * GIB  # CUDA context, NCCL buffers, allocator fragmentation: a margin, not a computation
# a plan above this share of the GPU fits on paper but leaves too little for what the plan does not count (allocator
# fragmentation, the margin's guesswork): `or1 plan` and the pre-flight warn
WARN_SHARE = 0.9
DEVICE = re.compile(r"(?:(\d+)\s*[xX]\s*)?(?:([\w.]+?)-)?(\d+(?:\.\d+)?)\s*(?:GB|GiB|G)?", re.IGNORECASE)
# vLLM's offline defaults on GPUs of 70 GiB and more (engine/arg_utils), below that 8192 tokens and 256 sequences
BATCHED_TOKENS = {True: 16384, False: 8192}
MAX_SEQUENCES = {True: 1024, False: 256}


@dataclass(frozen=True)
class Device:
    """The GPUs of one node: how many, their memory in bytes, a name for the table."""

    count: int
    memory: int
    name: str = "GPU"

    @classmethod
    def parse(cls, text: str) -> Device:
        """'8xH100-80GB', '8x80', 'H200-141GB' or '80' (GiB per GPU; count 8 when not given)."""
        match = DEVICE.fullmatch(text.strip())
        if not match:
            raise UserError(
                f"--gpus {text!r}: expected COUNTxNAME-MEMORY such as 8xH100-80GB (memory in GiB)"
            )
        count, name, memory = match.groups()
        return cls(int(count or 8), int(float(memory) * GIB), name or "GPU")

    @property
    def label(self) -> str:
        return f"{self.count}x{self.name}-{self.memory / GIB:g}GB"


@dataclass
class Phase:
    """One phase's per-GPU bytes, by part."""

    name: str
    parts: dict[str, int]

    @property
    def peak(self) -> int:
        return sum(self.parts.values())


@dataclass
class StagePlan:
    stage: str
    device: Device
    phases: list[Phase]
    settings: str  # the knobs the numbers depend on, one line
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what stops the stage whatever the peak

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.peak)

    @property
    def fits(self) -> bool:
        return self.peak.peak <= self.device.memory and not self.problems

    @property
    def tight(self) -> bool:
        """Fits, but with the peak above WARN_SHARE of the GPU."""
        return self.fits and self.peak.peak > WARN_SHARE * self.device.memory


def micro_window(cfg: RunConfig, section: OptimConfig | None = None) -> Window:
    """The largest micro-batch one rank runs in an update, by the actor's (or `section`'s) settings (worst case:
    every sequence at the full prompt + response length)."""
    a = section or cfg.actor
    sp = a.sequence_parallel_size
    seq = cfg.data.max_prompt_length + cfg.rollout.max_response_length
    response_share = cfg.rollout.max_response_length / seq
    budget = a.max_tokens_per_micro_batch
    if sp > 1:  # Ulysses: the group's micro-batch packed into one row, split over sp ranks
        group = max(seq, budget * sp if budget else a.micro_batch_size * seq)
        local = math.ceil(group / sp)
        return Window(tokens=local, logits=local, scored=local)
    rows = a.micro_batch_size if budget is None else max(1, budget // seq)
    if a.remove_padding:  # one packed row
        tokens = max(seq, budget or rows * seq)
        return Window(tokens=tokens, logits=tokens, scored=int(tokens * response_share))
    resp = cfg.rollout.max_response_length
    return Window(tokens=rows * seq, logits=rows * (resp + 1), scored=rows * resp, mask=rows * seq * seq)


def kv_saved_heads(section: OptimConfig, shape: ModelShape) -> int:
    """Key/value heads attention keeps: a packed row's flash varlen kernel takes the model's as they are; Ulysses
    repeats them up to one per rank; transformers' sdpa repeats them for every query head under a padded
    micro-batch's mask (on CUDA it passes grouped heads only without a mask)."""
    sp = section.sequence_parallel_size
    if sp > 1:
        return max(shape.kv_heads, sp)
    return shape.kv_heads if section.remove_padding else shape.heads


def plan_stage(cfg: RunConfig, shape: ModelShape, device: Device) -> StagePlan:
    """Every phase of `cfg`'s stage on `device` GPUs (nodes from cfg.trainer.nnodes); under rollout.placement
    separate the training ranks are trainer.devices_per_node a node and the replicas' GPUs are planned apart."""
    separate = cfg.rollout.placement == "separate"
    world = cfg.trainer.nnodes * (cfg.trainer.devices_per_node if separate else device.count)
    c = BYTES[cfg.model.dtype]
    shards = ShardState.of(shape, world)
    a, r = cfg.actor, cfg.rollout
    on_gpu = 0 if a.fsdp_cpu_offload else 1  # CPUOffloadPolicy: shards, gradients and moments on the host
    window = micro_window(cfg)
    checkpointing = cfg.model.gradient_checkpointing
    entropy_grad = cfg.algorithm.entropy.mode != "off"
    saved = memory.saved_activations(
        shape,
        window,
        compute_bytes=c,
        checkpointing=checkpointing,
        entropy_grad=entropy_grad,
        kv_saved_heads=kv_saved_heads(a, shape),
        extra_copy=a.sequence_parallel_size > 1,  # Ulysses's all-to-all copies the attention output
    )
    gathered = memory.gathered_bytes(shape, c)
    resident = on_gpu * (shards.parameters + shards.optimizer)
    update = Phase(
        "update",
        {
            "params": on_gpu * shards.parameters,
            "grads": on_gpu * shards.gradients,
            "adam": on_gpu * shards.optimizer,
            "gathered": gathered,
            "activations": saved.total,
            "backward": memory.backward_extra(shape, window, compute_bytes=c),
            "reserved": RESERVED,
        },
    )
    log_probs = Phase(
        "log-probs",
        {
            "params": on_gpu * shards.parameters,
            "adam": on_gpu * shards.optimizer,
            "gathered": gathered,
            "activations": memory.inference_bytes(shape, window, compute_bytes=c),
            "reserved": RESERVED,
        },
    )
    phases = [log_probs, update]
    notes: list[str] = []
    problems: list[str] = []
    if r.engine == "vllm" and separate:
        phases[:0], notes, problems = _replica_phases(cfg, shape, device, c)
    elif r.engine == "vllm":
        phases[:0], notes, problems = _rollout_phases(cfg, shape, device, shards, c)
    if cfg.uses_critic:  # the critic's shards stay on the GPU beside the actor's phases
        critic = _critic_phase(cfg, shape, world, c, resident)
        for phase in phases:
            phase.parts["critic"] = critic.parts["params"] + critic.parts["adam"]
        phases.append(critic)
    settings = (
        f"micro-batch {window.tokens:,} tokens/GPU, checkpointing {'on' if checkpointing else 'off'}, "
        f"SP {a.sequence_parallel_size}, offload {'fsdp-cpu' if a.fsdp_cpu_offload else 'on' if a.offload else 'off'}, "
        f"TP {r.tensor_parallel_size if r.engine == 'vllm' else '-'}"
    )
    if separate:
        settings += (
            f"; separate placement: {world} training GPUs, {r.replicas} rollout replica(s) on their own"
        )
    return StagePlan(cfg.stage.name, device, phases, settings, notes, problems)


@dataclass(frozen=True)
class Engine:
    """One vLLM engine's per-GPU bytes under rollout.gpu_memory_utilization: weights, workspace, the KV cache."""

    weights: int
    workspace: int
    kv: int
    per_token: int  # KV bytes of one token

    @classmethod
    def of(cls, cfg: RunConfig, shape: ModelShape, device: Device, c: int) -> Engine:
        tp = cfg.rollout.tensor_parallel_size
        large = device.memory >= 70 * GIB
        weights = memory.rollout_weight_bytes(shape, tp, c)
        workspace = memory.rollout_workspace_bytes(shape, tp, c, BATCHED_TOKENS[large], MAX_SEQUENCES[large])
        share = int(cfg.rollout.gpu_memory_utilization * device.memory)
        return cls(
            weights, workspace, max(0, share - weights - workspace), memory.kv_bytes_per_token(shape, tp, c)
        )

    def check(self, cfg: RunConfig, engines: int) -> tuple[list[str], list[str]]:
        """How many of an engine's sequences (the step's split over `engines`) its cache holds at full length, and
        a problem when not even one (vLLM refuses to start)."""
        r = cfg.rollout
        longest = cfg.data.max_prompt_length + max(
            r.max_response_length, cfg.data.validation.max_response_length or 0
        )
        held = self.kv // self.per_token
        sequences = math.ceil(cfg.trainer.batch_size * r.n / engines)
        notes = [
            f"KV cache {self.kv / GIB:.1f} GiB = {held:,} tokens ({self.per_token / 1024:.0f} KiB each): "
            f"{held // longest} of an engine's {sequences} sequences at full length ({longest:,} tokens) at once"
        ]
        problems = []
        if held < longest:
            problems.append(
                f"vLLM's KV cache ({self.kv / GIB:.1f} GiB of rollout.gpu_memory_utilization "
                f"{r.gpu_memory_utilization:g}) cannot hold one {longest:,}-token sequence "
                f"({longest * self.per_token / GIB:.1f} GiB)"
            )
        return notes, problems


def _rollout_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, shards: ShardState, c: int
) -> tuple[list[Phase], list[str], list[str]]:
    """vLLM's start (beside the actor's parameters, before any offload), the weight push (engine weights awake,
    the actor still on the GPU, one unit gathered and copied) and the generation (vLLM's share of the GPU, plus
    whatever of the actor stays there). Returns the phases, notes and problems."""
    r, a = cfg.rollout, cfg.actor
    engine = Engine.of(cfg, shape, device, c)
    host = a.fsdp_cpu_offload
    resident = 0 if host else shards.parameters + shards.optimizer
    unit = max(shape.root_parameters, shape.layer_parameters) * c
    share = int(r.gpu_memory_utilization * device.memory)
    start = Phase(
        "vllm start", {"actor": 0 if host else shards.parameters, "vllm": share, "reserved": RESERVED}
    )
    push = Phase("weight push", {"actor": resident, "vllm weights": engine.weights, "gathered": 2 * unit})
    push.parts["reserved"] = RESERVED
    generate = Phase(
        "rollout",
        {
            "actor": 0 if a.offload else resident,
            "vllm weights": engine.weights,
            "vllm workspace": engine.workspace,
            "kv cache": engine.kv,
            "reserved": RESERVED,
        },
    )
    notes, problems = engine.check(cfg, cfg.trainer.nnodes * device.count // r.tensor_parallel_size)
    return [start, push, generate], notes, problems


def _replica_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, c: int
) -> tuple[list[Phase], list[str], list[str]]:
    """A rollout replica of the separate placement on GPUs of its own: vLLM's share of the GPU (weights, workspace,
    KV cache) and nothing of the actor; the placement must leave the replicas their GPUs."""
    r = cfg.rollout
    engine = Engine.of(cfg, shape, device, c)
    replica = Phase(
        "rollout replica",
        {
            "vllm weights": engine.weights,
            "vllm workspace": engine.workspace,
            "kv cache": engine.kv,
            "reserved": RESERVED,
        },
    )
    notes, problems = engine.check(cfg, r.replicas)
    needed = cfg.trainer.nnodes * cfg.trainer.devices_per_node + r.replicas * r.tensor_parallel_size
    if needed > cfg.trainer.nnodes * device.count:
        problems.append(
            f"the separate placement needs {needed} GPUs (trainer.devices_per_node {cfg.trainer.devices_per_node} "
            f"x {cfg.trainer.nnodes} node(s) + rollout.replicas {r.replicas} x TP {r.tensor_parallel_size}), the "
            f"cluster has {cfg.trainer.nnodes * device.count}"
        )
    return [replica], notes, problems


def _critic_phase(cfg: RunConfig, shape: ModelShape, world: int, c: int, actor: int) -> Phase:
    """PPO's critic update: the same body with a one-output head, its own shards, trained like the actor, beside
    the actor's parameters and moments."""
    critic = ShardState.of(shape, world)
    window = micro_window(cfg, cfg.critic)
    scalar_head = Window(window.tokens, 0, 0, window.mask)  # no vocabulary-wide logits
    saved = memory.saved_activations(
        shape,
        scalar_head,
        compute_bytes=c,
        checkpointing=cfg.model.gradient_checkpointing,
        entropy_grad=False,
        kv_saved_heads=kv_saved_heads(cfg.critic, shape),
        extra_copy=cfg.critic.sequence_parallel_size > 1,
    )
    return Phase(
        "critic update",
        {
            "params": critic.parameters,
            "grads": critic.gradients,
            "adam": critic.optimizer,
            "gathered": memory.gathered_bytes(shape, c),
            "activations": saved.total,
            "actor": actor,
            "reserved": RESERVED,
        },
    )
