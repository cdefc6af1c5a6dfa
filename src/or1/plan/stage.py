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

A phase and what no term computes: `or1.plan.phase`; vLLM's phases, colocated and separate: `or1.plan.rollout`.
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
from or1.plan.phase import CUDA_CONTEXT, NCCL_BUFFERS, Phase
from or1.plan.rollout import replica_phases, rollout_phases

# a plan above this share of the GPU fits on paper but leaves too little for what the plan does not count (allocator
# fragmentation, the margins' guesswork): `or1 plan` and the pre-flight warn
WARN_SHARE = 0.9


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
        scored = int(tokens * response_share)  # the head runs on these positions only (packed_window)
        return Window(tokens=tokens, logits=scored, scored=scored)
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
    offloaded = 0
    if cfg.actor.activation_offload:
        offloaded = memory.offloaded_inputs(shape, micro_window(cfg), compute_bytes=BYTES[cfg.model.dtype])
    training_ranks = world // cfg.trainer.nnodes  # a node's
    replica_ranks = (
        max(0, min(r.replicas * r.tensor_parallel_size, device.count - training_ranks))
        if r.placement == "separate"
        else 0
    )
    host = host_need(cfg, shape, training_ranks, world, offloaded, replica_ranks)
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
    head_chunk = (a.head_chunk_tokens or memory.fused_head_chunk(shape)) if a.fused_head else None
    entropy_grad = cfg.algorithm.entropy.mode != "off"  # the entropy bonus's gradient through the head
    saved = memory.saved_activations(
        shape,
        window,
        compute_bytes=c,
        checkpointing=cfg.model.gradient_checkpointing,
        entropy_grad=entropy_grad,
        kv_saved_heads=kv_saved_heads(a, shape),
        extra_copy=a.sequence_parallel_size > 1,  # Ulysses's all-to-all copies the attention output
        head_chunk=head_chunk,
        activation_offload=a.activation_offload,
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
            "backward": memory.backward_extra(
                shape,
                window,
                compute_bytes=c,
                entropy_grad=entropy_grad,
                head_chunk=head_chunk,
                activation_offload=a.activation_offload,
            ),
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
            "activations": memory.inference_bytes(shape, window, compute_bytes=c, head_chunk=head_chunk),
            **outside,
        },
    )
    phases = [log_probs, update]
    if cfg.algorithm.kl.enabled:  # the reference's pass: its shards on the GPU beside the actor's
        phases.insert(1, Phase("ref log-probs", log_probs.parts | {"ref": ref}))
    notes: list[str] = []
    problems: list[str] = []
    if r.engine == "vllm" and r.placement == "separate":
        phases[:0], notes, problems = replica_phases(cfg, shape, device, c)
    elif r.engine == "vllm":
        phases[:0], notes, problems = rollout_phases(cfg, shape, device, shards, c, ref_stays)
    if cfg.uses_critic:  # the critic's shards stay on the GPU beside the actor's phases
        critic = _critic_phase(cfg, shape, world, c, resident + ref_stays, lengths)
        for phase in phases:
            phase.parts["critic"] = critic.parts["params"] + critic.parts["adam"]
        phases.append(critic)
    if not cfg.algorithm.kl.enabled:  # no reference policy: no column for it
        for phase in phases:
            phase.parts.pop("ref", None)
    return phases, notes, problems


def training_world(cfg: RunConfig, device: Device) -> int:
    """The training ranks: every GPU of the nodes, or under rollout.placement separate trainer.devices_per_node a
    node (the replicas have the others)."""
    per_node = cfg.trainer.devices_per_node if cfg.rollout.placement == "separate" else device.count
    return cfg.trainer.nnodes * per_node


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
