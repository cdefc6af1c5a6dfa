"""The per-GPU peak of each phase of one stage, in the order the colocated worker runs them, at two lengths.

A training rank holds the FSDP2 actor and a vLLM engine that take turns with the GPU (workers/weight_sync
`rollout_phase`): the engine wakes its weights, the actor's weights are pushed into them, the actor goes to the host
(actor.offload), the KV cache wakes, the engine samples, then sleeps (weights to the host, KV dropped) and the
actor comes back for the old log-probs (and, with KL, the reference policy's) and the update. A stage fits when the
largest of those phases fits; they are never added up.

Each phase is planned twice: the worst case, every sequence at data.max_prompt_length + rollout.max_response_length,
and the expected case, at the data's expected mean lengths (data.expected_prompt_length, and
rollout.expected_response_length or the previous stage's mean: `plan.lengths`). A stage whose expected peak does not
fit is refused; one whose worst case alone does not fit is warned about (a step whose responses all run to the
budget can fail). Without an expected length both are the worst case.

What no term computes is named by what it stands for, per GPU in every phase: the CUDA context and NCCL's buffers
(`CUDA_CONTEXT`, `NCCL_BUFFERS`), and, while vLLM is awake, its CUDA graphs (`CUDA_GRAPHS`), which vLLM captures
outside its gpu_memory_utilization share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from or1.config.schema import OptimConfig, RunConfig
from or1.plan import memory
from or1.plan.device import Device
from or1.plan.host import HostNeed, host_need
from or1.plan.memory import GIB, ShardState, Window
from or1.plan.model import BYTES, ModelShape

# The CUDA context and the kernel images loaded into it (cuBLAS, flash-attention, NCCL, vLLM's): created by the
# driver outside PyTorch's allocator, so no allocator statistic and no term here sees it (PyTorch's "CUDA semantics"
# notes count it apart from memory_reserved). Not measurable without a GPU: 1 GiB allowed.
CUDA_CONTEXT = 1 * GIB
# NCCL's communicator buffers (NCCL_BUFFSIZE, 4 MiB by default, per channel, peer and protocol, per communicator:
# the FSDP2 world, vLLM's tensor-parallel group, Ulysses groups): allocated by NCCL itself, outside PyTorch's allocator.
NCCL_BUFFERS = 1 * GIB
# vLLM's CUDA graphs of the decode batch sizes, captured after it sizes its KV cache and held outside its
# gpu_memory_utilization share while the engine is awake (vllm-project/vllm#11251); vLLM logs their size ("Graph
# capturing finished ..., took X GiB"), and nvidia-smi with and without --enforce-eager read 2,464 MiB apart in
# vllm-project/vllm#7553: the larger published reading.
CUDA_GRAPHS = int(2.5 * GIB)
# a plan above this share of the GPU fits on paper but leaves too little for what the plan does not count (allocator
# fragmentation, the margins' guesswork): `or1 plan` and the pre-flight warn
WARN_SHARE = 0.9
# vLLM's offline defaults on GPUs of 70 GiB and more (engine/arg_utils), below that 8192 tokens and 256 sequences
BATCHED_TOKENS = {True: 16384, False: 8192}
MAX_SEQUENCES = {True: 1024, False: 256}


@dataclass
class Phase:
    """One phase's per-GPU bytes, by part (worst case), and its peak at the expected lengths."""

    name: str
    parts: dict[str, int]
    expected: int | None = (
        None  # the peak at the expected lengths (None: no expected lengths, the worst case's)
    )

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def expected_peak(self) -> int:
        return self.peak if self.expected is None else self.expected


@dataclass
class StagePlan:
    stage: str
    device: Device
    phases: list[Phase]
    settings: str  # the knobs the numbers depend on, one line
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # what stops the stage whatever the peak
    host: HostNeed | None = None  # host memory of one node
    lengths: str = ""  # the lengths planned and where the expected ones come from, for the table

    @property
    def peak(self) -> Phase:
        """The phase with the largest worst-case peak."""
        return max(self.phases, key=lambda p: p.peak)

    @property
    def expected_peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.expected_peak)

    @property
    def fits(self) -> bool:
        """The expected peak fits the GPU, and nothing else stops the stage (vLLM's cache, host memory)."""
        return self.expected_peak.expected_peak <= self.device.memory and not self.problems

    @property
    def worst_fits(self) -> bool:
        return self.peak.peak <= self.device.memory

    @property
    def tight(self) -> bool:
        """Fits, but above WARN_SHARE of the GPU at the expected lengths, or beyond it at the worst case."""
        share = self.expected_peak.expected_peak > WARN_SHARE * self.device.memory
        return self.fits and (share or not self.worst_fits)


def micro_window(
    cfg: RunConfig, section: OptimConfig | None = None, lengths: tuple[int, int] | None = None
) -> Window:
    """The largest micro-batch one rank runs in an update, by the actor's (or `section`'s) settings, with every
    sequence `lengths` (prompt, response) tokens long: default the worst case, data.max_prompt_length and
    rollout.max_response_length."""
    a = section or cfg.actor
    sp = a.sequence_parallel_size
    prompt, resp = lengths or (cfg.data.max_prompt_length, cfg.rollout.max_response_length)
    seq = prompt + resp
    response_share = resp / seq
    budget = a.max_tokens_per_micro_batch
    if sp > 1:  # Ulysses: the group's micro-batch packed into one row, split over sp ranks
        group = max(seq, budget * sp if budget else a.micro_batch_size * seq)
        local = math.ceil(group / sp)
        return Window(tokens=local, logits=local, scored=local)
    rows = a.micro_batch_size if budget is None else max(1, budget // seq)
    if a.remove_padding:  # one packed row
        tokens = max(seq, budget or rows * seq)
        return Window(tokens=tokens, logits=tokens, scored=int(tokens * response_share))
    return Window(tokens=rows * seq, logits=rows * (resp + 1), scored=rows * resp, mask=rows * seq * seq)


def expected_lengths(cfg: RunConfig) -> tuple[int, int] | None:
    """(prompt, response) tokens the data is expected to produce, each at most its budget; None when neither
    data.expected_prompt_length nor rollout.expected_response_length says less than the budget."""
    top = (cfg.data.max_prompt_length, cfg.rollout.max_response_length)
    given = (cfg.data.expected_prompt_length, cfg.rollout.expected_response_length)
    lengths = tuple(min(g or t, t) for g, t in zip(given, top, strict=True))
    return None if lengths == top else (lengths[0], lengths[1])


def kv_saved_heads(section: OptimConfig, shape: ModelShape) -> int:
    """Key/value heads attention keeps: a packed row's flash varlen kernel takes the model's as they are; Ulysses
    repeats them up to one per rank; transformers' sdpa repeats them for every query head under a padded
    micro-batch's mask (on CUDA it passes grouped heads only without a mask)."""
    sp = section.sequence_parallel_size
    if sp > 1:
        return max(shape.kv_heads, sp)
    return shape.kv_heads if section.remove_padding else shape.heads


def plan_stage(cfg: RunConfig, shape: ModelShape, device: Device, source: str = "the recipe") -> StagePlan:
    """Every phase of `cfg`'s stage on `device` GPUs (nodes from cfg.trainer.nnodes), at the worst case and, when
    data.expected_prompt_length or rollout.expected_response_length is below its budget, at the expected lengths
    (`source`: where they came from); with the node's host memory, a problem when `device.host` cannot hold it."""
    a, r = cfg.actor, cfg.rollout
    phases, notes, problems = _phases(cfg, shape, device, None)
    expected = expected_lengths(cfg)
    top = f"{cfg.data.max_prompt_length:,} + {r.max_response_length:,}"
    lengths = f"every sequence at the budget, {top} tokens (no expected length given)"
    if expected is not None:
        for phase, at_expected in zip(phases, _phases(cfg, shape, device, expected)[0], strict=True):
            phase.expected = at_expected.peak
        lengths = f"sequences of {expected[0]:,} + {expected[1]:,} tokens expected ({source}), {top} at worst"
    world = training_world(cfg, device)
    host = host_need(cfg, shape, device.count, world)
    if device.host is not None and host.peak > device.host:
        moment = "loading the model" if host.load >= host.training else "training"
        problems.append(
            f"a node needs {host.peak / GIB:.0f} GiB of host memory ({moment}) of its {device.host / GIB:.0f} GiB"
        )
    window = micro_window(cfg)
    settings = (
        f"micro-batch {window.tokens:,} tokens/GPU, checkpointing "
        f"{'on' if cfg.model.gradient_checkpointing else 'off'}, SP {a.sequence_parallel_size}, offload "
        f"{'fsdp-cpu' if a.fsdp_cpu_offload else 'on' if a.offload else 'off'}, TP "
        f"{r.tensor_parallel_size if r.engine == 'vllm' else '-'}, KL {'on' if cfg.algorithm.kl.enabled else 'off'}"
    )
    if r.placement == "separate":
        settings += (
            f"; separate placement: {world} training GPUs, {r.replicas} rollout replica(s) on their own"
        )
    return StagePlan(cfg.stage.name, device, phases, settings, notes, problems, host, lengths)


def _phases(
    cfg: RunConfig, shape: ModelShape, device: Device, lengths: tuple[int, int] | None
) -> tuple[list[Phase], list[str], list[str]]:
    """The phases with every sequence `lengths` (prompt, response) tokens long (None: the budgets), with notes and
    problems."""
    world = training_world(cfg, device)
    c = BYTES[cfg.model.dtype]
    shards = ShardState.of(shape, world)
    a, r = cfg.actor, cfg.rollout
    on_gpu = 0 if a.fsdp_cpu_offload else 1  # CPUOffloadPolicy: shards, gradients and moments on the host
    window = micro_window(cfg, lengths=lengths)
    saved = memory.saved_activations(
        shape,
        window,
        compute_bytes=c,
        checkpointing=cfg.model.gradient_checkpointing,
        entropy_grad=cfg.algorithm.entropy.mode != "off",
        kv_saved_heads=kv_saved_heads(a, shape),
        extra_copy=a.sequence_parallel_size > 1,  # Ulysses's all-to-all copies the attention output
    )
    gathered = memory.gathered_bytes(shape, c)
    resident = on_gpu * (shards.parameters + shards.optimizer)
    # the float32 reference policy (KL only): sharded like the actor, on the GPU for its own pass; between passes
    # on the host under actor.offload or CPUOffloadPolicy, else on the GPU all the time
    ref = on_gpu * shards.parameters if cfg.algorithm.kl.enabled else 0
    ref_stays = 0 if a.offload else ref
    outside = {"context": CUDA_CONTEXT, "nccl": NCCL_BUFFERS}
    update = Phase(
        "update",
        {
            "params": on_gpu * shards.parameters,
            "grads": on_gpu * shards.gradients,
            "adam": on_gpu * shards.optimizer,
            "ref": ref_stays,
            "gathered": gathered,
            "activations": saved.total,
            "backward": memory.backward_extra(shape, window, compute_bytes=c),
            **outside,
        },
    )
    log_probs = Phase(
        "log-probs",
        {
            "params": on_gpu * shards.parameters,
            "adam": on_gpu * shards.optimizer,
            "ref": ref_stays,
            "gathered": gathered,
            "activations": memory.inference_bytes(shape, window, compute_bytes=c),
            **outside,
        },
    )
    phases = [log_probs, update]
    if cfg.algorithm.kl.enabled:  # the reference's pass: its shards on the GPU beside the actor's
        phases.insert(1, Phase("ref log-probs", log_probs.parts | {"ref": ref}))
    notes: list[str] = []
    problems: list[str] = []
    if r.engine == "vllm" and r.placement == "separate":
        phases[:0], notes, problems = _replica_phases(cfg, shape, device, c)
    elif r.engine == "vllm":
        phases[:0], notes, problems = _rollout_phases(cfg, shape, device, shards, c, ref_stays)
    if cfg.uses_critic:  # the critic's shards stay on the GPU beside the actor's phases
        critic = _critic_phase(cfg, shape, world, c, resident + ref_stays, lengths)
        for phase in phases:
            phase.parts["critic"] = critic.parts["params"] + critic.parts["adam"]
        phases.append(critic)
    if not cfg.algorithm.kl.enabled:  # no reference policy: no column for it
        for phase in phases:
            phase.parts.pop("ref", None)
    return phases, notes, problems


def _rollout_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, shards: ShardState, c: int, ref: int
) -> tuple[list[Phase], list[str], list[str]]:
    """vLLM's start (beside the actor's parameters, before any offload), the weight push (engine weights awake,
    the actor still on the GPU, one unit gathered and copied) and the generation (vLLM's share of the GPU, its
    CUDA graphs, plus whatever of the actor and the reference (`ref`) stays there). Returns the phases, notes and
    problems."""
    r, a = cfg.rollout, cfg.actor
    engine = int(r.gpu_memory_utilization * device.memory)
    weights, workspace, kv = _engine_parts(cfg, shape, device, c)
    host = a.fsdp_cpu_offload
    resident = 0 if host else shards.parameters + shards.optimizer
    unit = max(shape.root_parameters, shape.layer_parameters) * c
    outside = {"context": CUDA_CONTEXT, "nccl": NCCL_BUFFERS}
    start = Phase(
        "vllm start",
        {"actor": 0 if host else shards.parameters, "vllm": engine, "graphs": CUDA_GRAPHS, **outside},
    )
    push = Phase(
        "weight push",
        {
            "actor": resident,
            "ref": ref,
            "vllm weights": weights,
            "gathered": 2 * unit,
            "graphs": CUDA_GRAPHS,
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
            "graphs": CUDA_GRAPHS,
            **outside,
        },
    )
    notes, problems = _engine_check(
        cfg, shape, kv, c, cfg.trainer.nnodes * device.count // r.tensor_parallel_size
    )
    return [start, push, generate], notes, problems


def training_world(cfg: RunConfig, device: Device) -> int:
    """The training ranks: every GPU of the nodes, or under rollout.placement separate trainer.devices_per_node a
    node (the replicas have the others)."""
    per_node = cfg.trainer.devices_per_node if cfg.rollout.placement == "separate" else device.count
    return cfg.trainer.nnodes * per_node


def _engine_parts(cfg: RunConfig, shape: ModelShape, device: Device, c: int) -> tuple[int, int, int]:
    """One vLLM engine's per-GPU weights, workspace and KV cache (what is left of its gpu_memory_utilization share)."""
    tp = cfg.rollout.tensor_parallel_size
    large = device.memory >= 70 * GIB
    weights = memory.rollout_weight_bytes(shape, tp, c)
    workspace = memory.rollout_workspace_bytes(shape, tp, c, BATCHED_TOKENS[large], MAX_SEQUENCES[large])
    share = int(cfg.rollout.gpu_memory_utilization * device.memory)
    return weights, workspace, max(0, share - weights - workspace)


def _engine_check(
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


def _replica_phases(
    cfg: RunConfig, shape: ModelShape, device: Device, c: int
) -> tuple[list[Phase], list[str], list[str]]:
    """A rollout replica of the separate placement on GPUs of its own: vLLM's share of the GPU (weights, workspace,
    KV cache) and its CUDA graphs, nothing of the actor; a problem when the placement asks for more GPUs than the
    nodes have."""
    r = cfg.rollout
    weights, workspace, kv = _engine_parts(cfg, shape, device, c)
    replica = Phase(
        "rollout replica",
        {
            "vllm weights": weights,
            "vllm workspace": workspace,
            "kv cache": kv,
            "graphs": CUDA_GRAPHS,
            "context": CUDA_CONTEXT,
            "nccl": NCCL_BUFFERS,
        },
    )
    notes, problems = _engine_check(cfg, shape, kv, c, r.replicas)
    needed = cfg.trainer.nnodes * cfg.trainer.devices_per_node + r.replicas * r.tensor_parallel_size
    if needed > cfg.trainer.nnodes * device.count:
        problems.append(
            f"the separate placement needs {needed} GPUs (trainer.devices_per_node {cfg.trainer.devices_per_node} "
            f"x {cfg.trainer.nnodes} node(s) + rollout.replicas {r.replicas} x TP {r.tensor_parallel_size}), the "
            f"nodes have {cfg.trainer.nnodes * device.count}"
        )
    return [replica], notes, problems


def _critic_phase(
    cfg: RunConfig, shape: ModelShape, world: int, c: int, actor: int, lengths: tuple[int, int] | None
) -> Phase:
    """PPO's critic update: the same body with a one-output head, its own shards, trained like the actor, beside
    the actor's parameters and moments."""
    critic = ShardState.of(shape, world)
    window = micro_window(cfg, cfg.critic, lengths)
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
            "context": CUDA_CONTEXT,
            "nccl": NCCL_BUFFERS,
        },
    )
