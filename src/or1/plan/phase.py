"""A phase of a stage (what one GPU holds meanwhile, by part), and what every phase holds that no term computes.

What no term computes is named by what it stands for, per GPU in every phase: the CUDA context and NCCL's buffers
(`CUDA_CONTEXT`, `NCCL_BUFFERS`), and, while vLLM is awake, its CUDA graphs (`or1.plan.rollout.CUDA_GRAPHS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from or1.plan.memory import GIB

# The CUDA context and the kernel images loaded into it (cuBLAS, flash-attention, NCCL, vLLM's): created by the
# driver outside PyTorch's allocator, so no allocator statistic and no term here sees it (PyTorch's "CUDA semantics"
# notes count it apart from memory_reserved). Not measurable without a GPU: 1 GiB allowed.
CUDA_CONTEXT = 1 * GIB
# NCCL's communicator buffers (NCCL_BUFFSIZE, 4 MiB by default, per channel, peer and protocol, per communicator:
# the FSDP2 world, vLLM's tensor-parallel group, Ulysses groups): allocated by NCCL itself, outside PyTorch's allocator.
NCCL_BUFFERS = 1 * GIB


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
