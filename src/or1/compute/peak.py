"""A device's peak FLOP/s, the denominator of MFU: a GPU's from its datasheet, else a short matmul benchmark.

The table holds dense (no sparsity) BF16 tensor-core TFLOP/s, half the with-sparsity figure NVIDIA's datasheets
print, by a part of `torch.cuda.get_device_name()`. A CPU, a GPU not in the table or one computing in float32 gets
a measured peak instead: the best of repeated square matmuls in the compute dtype at the process's thread count
(a fraction of a second), which is what the device reaches on dense matmuls, not a vendor's number.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# The first name found in the device name wins: more specific names come first (H100 NVL before H100, A100
# before A10, L40S before L40 before L4).
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("B200", 2250.0),  # NVIDIA HGX B200 datasheet: 4.5 PFLOPS FP16/BF16 per GPU with sparsity
    ("GH200", 989.5),  # NVIDIA GH200 Grace Hopper Superchip datasheet: 1,979 TFLOPS BF16 with sparsity
    ("H200 NVL", 835.5),  # NVIDIA H200 Tensor Core GPU datasheet, H200 NVL: 1,671 with sparsity
    ("H200", 989.5),  # NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: 1,979 with sparsity
    ("H100 NVL", 835.5),  # NVIDIA H100 Tensor Core GPU datasheet, H100 NVL: 1,671 with sparsity
    ("H100 PCIe", 756.5),  # NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: 1,513 with sparsity
    ("H100", 989.5),  # NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: 1,979 with sparsity
    ("A100", 312.0),  # NVIDIA A100 Tensor Core GPU datasheet: 312 dense, 624 with sparsity
    ("L40S", 362.05),  # NVIDIA L40S datasheet: 362.05 dense, 733 with sparsity
    ("L40", 181.05),  # NVIDIA L40 datasheet: 181.05 dense, 362.1 with sparsity
    ("L4", 121.0),  # NVIDIA L4 Tensor Core GPU datasheet: 242 with sparsity
    ("A10", 125.0),  # NVIDIA A10 Tensor Core GPU datasheet (also the A10G): 125 dense, 250 with sparsity
)
SIXTEEN_BIT = ("bfloat16", "float16")
MEASURE_SECONDS = 0.25  # the benchmark's time budget


@dataclass(frozen=True)
class DevicePeak:
    """One device's peak: what it is, TFLOP/s, and whether from the table or measured."""

    device: str  # torch.cuda.get_device_name(), or "cpu (N threads)"
    tflops: float
    source: str  # "table" (datasheet, dense bf16) or "measured" (matmul benchmark)


def table_tflops(device_name: str) -> float | None:
    """The datasheet's dense bf16 TFLOP/s of a GPU by its name; None when the table has no such GPU."""
    return next((tflops for name, tflops in GPU_PEAK_TFLOPS if name in device_name), None)


def device_peak(device: torch.device, compute_dtype: str) -> DevicePeak:
    """The peak that MFU divides by on `device` computing in `compute_dtype` (the training's)."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        found = table_tflops(name) if compute_dtype in SIXTEEN_BIT else None
        if found is not None:
            return DevicePeak(name, found, "table")
        return DevicePeak(name, measured_tflops(device, compute_dtype), "measured")
    threads = torch.get_num_threads()
    name = f"cpu ({threads} thread{'s' if threads > 1 else ''})"
    return DevicePeak(name, measured_tflops(device, compute_dtype), "measured")


def measured_tflops(device: torch.device, dtype: str, size: int | None = None) -> float:
    """TFLOP/s of the fastest of repeated [size x size] @ [size x size] matmuls in `dtype` (float32 on a CPU,
    whose kernels want it) within MEASURE_SECONDS, after one warm-up."""
    import torch

    on_gpu = device.type == "cuda"
    size = size or (8192 if on_gpu else 1024)
    kind = getattr(torch, dtype) if on_gpu else torch.float32
    a = torch.randn(size, size, device=device, dtype=kind)
    b = torch.randn(size, size, device=device, dtype=kind)
    best = float("inf")
    deadline = time.perf_counter() + MEASURE_SECONDS
    for i in range(1000):
        if on_gpu:
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if on_gpu:
            torch.cuda.synchronize(device)
        if i:  # the first is the warm-up
            best = min(best, time.perf_counter() - start)
        if i and time.perf_counter() > deadline:
            break
    return 2.0 * size**3 / best / 1e12
