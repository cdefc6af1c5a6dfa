"""The FSDP2 engine on one CUDA GPU (marked gpu; skipped without CUDA): bf16 mixed precision with float32 master
weights and reduction, the offload hand-off, FSDP2's CPUOffloadPolicy, activation checkpointing. Passed on one H200
with torch 2.11 (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp_engine import make_batch

from or1.algos.losses import LossConfig
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.train_settings import TrainSettings
from or1.hybrid.worker import GPU_BACKEND

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture
def one_rank(tmp_path: Path):
    torch.cuda.set_device(0)
    dist.init_process_group(GPU_BACKEND, init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def cuda_settings(**extra) -> TrainSettings:
    return TrainSettings(device="cuda:0", mixed_precision="bfloat16", lr=1e-3, micro_batch_size=4, **extra)


def optimizer_state(engine: FSDPPolicyEngine) -> list[torch.Tensor]:
    """Adam's moment tensors (its step counter stays on the host)."""
    return [v for s in engine.optimizer.state.values() for k, v in s.items() if k != "step"]


def step(engine: FSDPPolicyEngine) -> dict[str, float]:
    return engine.train_step(make_batch(8), LossConfig(), temperature=1.0)


def test_mixed_precision_keeps_float32_master_weights_on_the_gpu(one_rank, model_dir: Path) -> None:
    engine = FSDPPolicyEngine(model_dir, cuda_settings(gradient_checkpointing=True))
    params = list(engine.model.parameters())
    assert all(p.device.type == "cuda" and p.dtype == torch.float32 for p in params)
    lp = engine.log_probs(make_batch(8), temperature=1.0)["log_probs"]
    assert lp.device.type == "cpu" and torch.isfinite(lp).all()  # results come back to the host
    before = {n: t.float().cpu() for n, t in engine.named_full_params()}
    assert all(t.dtype == torch.bfloat16 for _, t in engine.named_full_params())  # gathered in compute dtype
    metrics = step(engine)
    assert metrics["grad_norm"] > 0
    after = {n: t.float().cpu() for n, t in engine.named_full_params()}
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_offload_moves_parameters_and_optimizer_state_to_the_host_and_back(one_rank, model_dir: Path) -> None:
    engine = FSDPPolicyEngine(model_dir, cuda_settings(offload=True))
    step(engine)  # the optimizer state exists from here on
    held = torch.cuda.memory_allocated()
    moving = sum(t.numel() * t.element_size() for t in [*engine.model.parameters(), *optimizer_state(engine)])
    engine.offload()
    assert all(p.device.type == "cpu" for p in engine.model.parameters())
    states = optimizer_state(engine)
    assert states and all(v.device.type == "cpu" for v in states)
    # the GPU gives back the shards and the optimizer state (not cuBLAS's workspace, which outweighs the tiny model)
    assert held - torch.cuda.memory_allocated() >= moving
    engine.onload()
    assert all(p.device.type == "cuda" for p in engine.model.parameters())
    assert all(v.device.type == "cuda" for v in optimizer_state(engine))
    assert torch.isfinite(torch.tensor(step(engine)["grad_norm"]))


def test_cpu_offload_policy_keeps_shards_on_the_host(one_rank, model_dir: Path) -> None:
    engine = FSDPPolicyEngine(model_dir, cuda_settings(fsdp_cpu_offload=True))
    assert all(p.device.type == "cpu" for p in engine.model.parameters())
    metrics = step(engine)
    assert metrics["grad_norm"] > 0 and all(p.device.type == "cpu" for p in engine.model.parameters())
