"""The FSDP2 engine on one CUDA GPU (marked gpu; skipped without CUDA): bf16 mixed precision with float32 master
weights and reduction, the offload hand-off, FSDP2's CPUOffloadPolicy, activation checkpointing. Passed on one H200
with torch 2.11 (docs/gpu.md)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp_engine import make_batch

from or1.algos.losses import LossConfig, token_log_probs
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.loading import load_causal_lm
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


def test_the_fused_head_on_cuda_matches_the_whole_logits_and_measures_the_head_dtype(
    one_rank, model_dir: Path
) -> None:
    """bf16 compute: the fused head (chunks through the head in bf16) gives the whole logits' log-probs and update
    to bf16 rounding; `actor.head_dtype: float32` is measured against a bf16 sampler (the same weights in bf16 end
    to end, as the HF engine samples) and against the float32 policy, written to $OR1_GPU_MEASUREMENTS (the prepared
    GPU check's file) when set."""
    batch = make_batch(8)
    mask = batch["response_mask"].bool()
    runs = {}
    for name, extra in {
        "whole": {"fused_head": False},
        "fused": {"fused_head": True},
        "fused-float32": {"fused_head": True, "head_dtype": "float32"},
    }.items():
        engine = FSDPPolicyEngine(model_dir, cuda_settings(**extra))
        log_probs = engine.log_probs(batch, temperature=1.0)["log_probs"]
        runs[name] = (log_probs, step(engine))
        del engine
    references = {}
    for dtype in (torch.bfloat16, torch.float32):  # the sampler's numbers, and the policy's exact ones
        model = load_causal_lm(model_dir, dtype=dtype).cuda()
        references[dtype] = plain_log_probs(model, batch).cpu()
    gap = {
        name: {
            "sampler_abs_diff_mean": float((lp - references[torch.bfloat16])[mask].abs().mean()),
            "float32_abs_diff_mean": float((lp - references[torch.float32])[mask].abs().mean()),
        }
        for name, (lp, _) in runs.items()
    }
    whole, fused = runs["whole"], runs["fused"]
    assert float((fused[0] - whole[0])[mask].abs().max()) < 0.05  # bf16 rounding of the same logits, chunked
    for key in ("pg_loss", "grad_norm", "entropy"):
        assert fused[1][key] == pytest.approx(whole[1][key], rel=2e-2, abs=1e-3), key
    assert gap["fused-float32"]["float32_abs_diff_mean"] <= gap["fused"]["float32_abs_diff_mean"]
    if out := os.environ.get("OR1_GPU_MEASUREMENTS"):
        with open(out, "a") as sink:
            sink.write(
                json.dumps({"measure": "head_dtype", "device": torch.cuda.get_device_name(), **gap}) + "\n"
            )


def plain_log_probs(model, batch) -> torch.Tensor:
    """Log-probs [B, R] of the batch's responses from one padded forward of a plain Hugging Face model."""
    ids, mask = batch["input_ids"].cuda(), batch["attention_mask"].cuda()
    responses = batch["responses"].cuda()
    with torch.no_grad():
        logits = model(
            input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)
        ).logits
    width = responses.shape[1]
    return token_log_probs(logits[:, -width - 1 : -1].float(), responses)
