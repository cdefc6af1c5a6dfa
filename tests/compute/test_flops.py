"""The update's model FLOPs: the formula by hand, and against torch's own count (`torch.utils.flop_counter`) of a
forward and backward of the tiny Qwen2 on a packed micro-batch, as the actor runs it on the CPU."""

from __future__ import annotations

import pytest
import torch
from torch.utils import flop_counter
from transformers import Qwen2Config, Qwen2ForCausalLM

from or1.algos.losses import token_log_probs
from or1.compute.flops import forward_flops, training_flops
from or1.engines import varlen
from or1.engines.packing import packed_window
from or1.plan.model import ModelShape
from or1.workers.rollout_rows import pack_sequences
from plan.test_memory import CONFIG  # the plan tests' small Qwen2

SHAPE = ModelShape.from_config(CONFIG)
aten = torch.ops.aten
# torch has formulas for the CUDA sdpa kernels only: the CPU's flash kernel gets the same ones (the full L x L square
# of every head, forward; the backward's five matmuls, the scores recomputed)
CPU_SDPA = {
    aten._scaled_dot_product_flash_attention_for_cpu: lambda q, k, v, *_, **__: flop_counter.sdpa_flop_count(
        q, k, v
    ),
    aten._scaled_dot_product_flash_attention_for_cpu_backward: (
        lambda g, q, k, v, *_, **__: flop_counter.sdpa_backward_flop_count(g, q, k, v)
    ),
}


def test_forward_flops_by_hand():
    # a block: q 64x64, k and v 64x32 each, o 64x64, the MLP 3 x 64x128
    block = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    f = forward_flops(SHAPE, [3, 5], logits=4)
    assert f.blocks == 2 * 2 * block * 8
    # causal: 3 x 4 / 2 + 5 x 6 / 2 = 21 (query, key) pairs per head and layer; scores and values, 2 FLOPs a MAC
    assert f.attention == 2 * 4 * 21 * 2 * 2 * 16
    assert f.head == 2 * 64 * 301 * 4
    assert training_flops(SHAPE, [3, 5], 4) == 3 * f.total
    # checkpointing re-runs each block but its MLP's down projection (64 x 128), which backward does not need
    recomputed = f.blocks * (block - 64 * 128) / block + f.attention
    assert training_flops(SHAPE, [3, 5], 4, recompute=True) == pytest.approx(
        3 * f.total + recomputed, rel=1e-12
    )


def micro_batch() -> dict[str, torch.Tensor]:
    """Prompts of 20 tokens and responses of 140, 140, 80, 80 and 20: sequences whose lengths (160, 100, 40) the
    CPU kernel groups without padding (`varlen.GROUP_RATIO`), so its sdpa calls see each sequence's own square."""
    g = torch.Generator().manual_seed(0)
    responses = [140, 140, 80, 80, 20]
    prompts = [torch.randint(3, 300, (20,), generator=g).tolist() for _ in responses]
    answers = [torch.randint(3, 300, (n,), generator=g).tolist() for n in responses]
    return pack_sequences(prompts, answers, 20, max(responses), 0)


def counted(model: Qwen2ForCausalLM, micro: dict[str, torch.Tensor]) -> dict[str, float]:
    """torch's count of one forward and backward of the actor's log-prob loss, split into sdpa and the rest."""
    window = packed_window(micro)
    with flop_counter.FlopCounterMode(display=False, custom_mapping=CPU_SDPA) as counter:
        logits = model(**window.inputs, use_cache=False, logits_to_keep=window.logits_to_keep).logits
        token_log_probs(window.kept(logits), window.targets).sum().backward()
    ops = counter.get_flop_counts()["Global"]
    attention = sum(n for op, n in ops.items() if "scaled_dot_product" in str(op))
    return {"attention": attention, "rest": counter.get_total_flops() - attention}


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
def test_update_flops_within_10_percent_of_torchs_count(checkpointing):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CONFIG, dtype="float32"))
    model.train()
    varlen.enable(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    micro = micro_batch()
    lengths = micro["attention_mask"].sum(-1).tolist()
    logits = int(micro["attention_mask"][:, 20:].sum())
    torch_count = counted(model, micro)
    assert torch_count["attention"] > 0  # the CPU kernel was counted
    # torch counts every head's full L x L square ("not accounting for causal attention"); the causal kernel
    # computes the lower triangle with its diagonal, L (L + 1) / 2 of the L^2 pairs
    causal = sum(n * (n + 1) / 2 for n in lengths) / sum(n * n for n in lengths)
    reference = torch_count["rest"] + causal * torch_count["attention"]
    ours = training_flops(SHAPE, lengths, logits, recompute=checkpointing)
    assert abs(ours - reference) <= 0.10 * reference, (ours, reference, torch_count, causal)
    # the weight matmuls alone agree exactly: the blocks and the head 3 times, and the blocks' re-run (but for the
    # down projection, torch's checkpoint stops before it) under checkpointing
    forward = forward_flops(SHAPE, lengths, logits)
    rerun = ours - 3 * forward.total - forward.attention if checkpointing else 0.0
    assert torch_count["rest"] == pytest.approx(3 * (forward.blocks + forward.head) + rerun, rel=1e-9)
