"""Host memory of one node: what each of its ranks puts in the machine's RAM, summed over the node's ranks.

Two moments count. Loading: every rank reads the whole model from disk in float32 (`engines.loading.
load_causal_lm`) before FSDP2 shards it, so a node briefly holds one full copy per rank. Training: what the
settings keep on the host between passes, per rank: FSDP2's CPUOffloadPolicy (actor.fsdp_cpu_offload) keeps the
float32 parameters, gradients and AdamW moments there all the time (pinned, so they cannot be swapped out);
actor.offload moves parameters and moments there while vLLM samples; the reference policy (KL) waits there
under either; vLLM's sleep mode backs its weights up in host memory while the actor trains (colocated only);
actor.activation_offload keeps a micro-batch's checkpointed block inputs there during each update; and under the
separate placement the versions of the weights on their way to the replicas (rollout.weight_transfer): collective,
each training rank's snapshots of its shard of the k + 1 versions a step may sample with (k = rollout.max_staleness)
and each replica rank's received versions staged until it loads them, up to k + 1 whole models; object_store, those
k + 1 whole models in Ray's object store (on the head node: planned on every node), every training rank's gathered
copy while it publishes, and each replica rank's copy out of the store.
"""

from __future__ import annotations

from dataclasses import dataclass

from or1.config.schema import RunConfig
from or1.plan import memory
from or1.plan.memory import FLOAT32, ShardState
from or1.plan.model import BYTES, ModelShape


@dataclass(frozen=True)
class HostNeed:
    """Bytes of host memory one node needs, by moment and part."""

    load: int  # every rank's full float32 copy while the model loads
    parts: dict[str, int]  # what stays on the host while training

    @property
    def training(self) -> int:
        return sum(self.parts.values())

    @property
    def peak(self) -> int:
        return max(self.load, self.training)


def host_need(
    cfg: RunConfig,
    shape: ModelShape,
    devices_per_node: int,
    world: int,
    offloaded_inputs: int = 0,
    replica_ranks: int = 0,
) -> HostNeed:
    """The host memory one node of `devices_per_node` training ranks (of `world`) and `replica_ranks` rollout
    replica ranks (the separate placement's) needs for `cfg`'s stage (`offloaded_inputs`: one rank's offloaded
    activations, `memory.offloaded_inputs`)."""
    a, r = cfg.actor, cfg.rollout
    shards = ShardState.of(shape, world)
    ranks = devices_per_node
    parts: dict[str, int] = {}
    if a.fsdp_cpu_offload:
        parts["actor (fsdp-cpu)"] = ranks * (shards.parameters + shards.gradients + shards.optimizer)
    elif a.offload:
        parts["actor (offload)"] = ranks * (shards.parameters + shards.optimizer)
    if cfg.algorithm.kl.enabled and (a.fsdp_cpu_offload or a.offload):
        parts["reference"] = ranks * shards.parameters
    if r.engine == "vllm" and r.placement == "colocated":  # sleep level 1: every engine's weights on the host
        # (a replica of the separate placement never sleeps)
        tp = r.tensor_parallel_size
        parts["vllm weights"] = ranks * memory.rollout_weight_bytes(
            shape, tp, BYTES[r.dtype or cfg.model.dtype]
        )
    if offloaded_inputs:
        parts["activations (offload)"] = ranks * offloaded_inputs
    if r.placement == "separate":
        c = BYTES[cfg.model.dtype]  # the dtype FSDP2 unshards to: the weights' on their way
        versions, whole = r.max_staleness + 1, shape.parameters * c
        if r.weight_transfer == "collective":
            parts["weight snapshots"] = ranks * versions * memory.shard_bytes(shape, world, c)
            parts["staged weights"] = replica_ranks * versions * whole
        else:
            parts["published weights"] = versions * whole
            parts["gathered weights"] = ranks * whole
            parts["replica copies"] = replica_ranks * whole
    load = ranks * shape.parameters * FLOAT32
    return HostNeed(load=load, parts=parts)
