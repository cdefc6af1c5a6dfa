"""A phase of a stage (what one GPU holds meanwhile, by part), and what every phase holds that no term computes.

What no term computes is named by what it stands for, per GPU in every phase: the CUDA context and what NCCL and the
CUDA libraries allocate outside PyTorch's allocator (`CUDA_CONTEXT`, `NCCL_BUFFERS`), and the caching allocator's
fragmentation over the bytes a pass allocates and frees (`FRAGMENTATION`, a part of its own in every phase that has
such bytes). vLLM's CUDA graphs are inside its gpu_memory_utilization share (`or1.plan.rollout.CUDA_GRAPHS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from or1.plan.memory import GIB

# Measured on 8 x 80 GB GPUs (CUDA 12.4, NCCL 2.21.5, verl's FSDP workers, one process per GPU;
# dingxianzhong/play-verl logs/verl_ppo_qwen2.5b_8gpu.log and logs/verl_qwen2_7b_min.log, torch's counters beside
# `torch.cuda.mem_get_info`): 0.51 GiB of the GPU in use before the process's first allocation, and 3.32 GiB in use
# beyond PyTorch's reserved bytes once FSDP had run its first collectives, in both runs.
# The CUDA context, its kernel images loaded lazily (CUDA >= 12.2 loads a module at its first launch): the first
# reading. Cards of other generations were not measured; the same figure is planned for them.
CUDA_CONTEXT = GIB // 2
# NCCL's communicator buffers (per channel, peer and protocol, per communicator: the FSDP2 world, vLLM's
# tensor-parallel group, Ulysses groups; NVLink SHARP's on H100 nodes) and the CUDA libraries' workspaces (cuBLAS):
# the second reading less the first, 2.8 GiB. Planned on every GPU whatever the world size (a world of one needs less).
NCCL_BUFFERS = int(2.8 * GIB)
# The caching allocator rounds and splits the blocks a pass allocates and frees (gathered units, saved activations,
# the backward's transients): its reserved bytes run above the allocated ones, more so when micro-batches change size
# (token budgets). A tenth of those dynamic bytes: with it, the plan's update phase is within 10% of nine of ten
# published reserved peaks of an FSDP2 RL trainer's update (tests/plan/test_measured.py), without it up to 12% under
# the larger ones. bench/gpu_check.py records max_memory_reserved beside max_memory_allocated for or1's own passes.
FRAGMENTATION = 0.10
DYNAMIC = ("gathered", "activations", "backward")


@dataclass
class Phase:
    """One phase's per-GPU bytes, by part (worst case), and its peak at the expected lengths. A phase with dynamic
    parts holds the allocator's fragmentation over them too (the part "fragmentation", `FRAGMENTATION`)."""

    name: str
    parts: dict[str, int]
    expected: int | None = (
        None  # the peak at the expected lengths (None: no expected lengths, the worst case's)
    )

    def __post_init__(self) -> None:
        dynamic = sum(self.parts.get(part, 0) for part in DYNAMIC)
        if dynamic:
            self.parts["fragmentation"] = int(FRAGMENTATION * dynamic)

    @property
    def peak(self) -> int:
        return sum(self.parts.values())

    @property
    def expected_peak(self) -> int:
        return self.peak if self.expected is None else self.expected
