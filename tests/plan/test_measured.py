"""`or1 plan` held against measured peaks: published GPU memory readings of FSDP2 RL trainers, each with the
settings that produced it, planned as the or1 settings that do the same.

The readings are prime-rl's trainer benchmarks (PrimeIntellect-ai/prime-rl `benchmarks/baselines/benchmark-<gpus>-
<model>-rl-full-<n>gpu-<ac>-<attention>-<seq>-cp1-ep1.json`, "peak_memory" "gib"): `torch.cuda.max_memory_reserved()`
on rank 0, its peak reset at the start of every step (`src/prime_rl/trainer/rl/train.py`), averaged over the steps
after the first. A step is two micro-batches of one sequence of exactly `seq` tokens, every position in the loss;
float32 master weights and AdamW moments (the trainer's `optimization_dtype` default), bf16 compute, float32
reduction, FSDP2 over the GPUs, full activation checkpointing ("Recompute") or its inputs offloaded to the host
("Offload"), compiled, a fused output head, no reference policy, no critic; vLLM runs on other GPUs. So each is one
update phase, reserved bytes included: the plan's update phase less the context and NCCL's buffers (outside
PyTorch's allocator), with its fragmentation allowance (inside the reserved bytes).

What differs: prime-rl's head goes through the vocabulary 2,048 columns at a time for every position, or1's through
the positions 441 at a time for the whole vocabulary (`actor.fused_head`); both hold well under 1.5 GiB of transients
at these shapes. Every full fine-tune of a dense model in that folder is here; the H200 files carry the H100's bytes
exactly and are left out as copies.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from or1.config.recipe import resolve
from or1.plan.memory import GIB
from or1.plan.model import ModelShape
from or1.plan.stage import Device, plan_stage


def qwen3(layers: int, hidden: int, heads: int, intermediate: int) -> dict:
    """A Qwen3 dense model's config.json numbers (8 key/value heads of 128, vocabulary 151,936, tied head)."""
    return {
        "model_type": "qwen3",
        "num_hidden_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": intermediate,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    }


QWEN3_0_6B = qwen3(28, 1024, 16, 3072)
QWEN3_4B = qwen3(36, 2560, 32, 9728)  # Qwen3-4B-Instruct-2507


@dataclass(frozen=True)
class Reading:
    name: str
    source: str  # the baseline file's GPUs and attention, its commit or run date
    model: dict
    gpus: int
    seq: int
    reserved_gib: float
    offload: bool = False  # "Offload": the checkpointed inputs on the host
    wide: str = ""  # why this reading may be up to 20% from the plan


READINGS = [
    Reading(
        "Qwen3-0.6B, 16K", "1xh100 flash_attention_3, run 2026-01-15 (8718eb1)", QWEN3_0_6B, 1, 16384, 12.528
    ),
    Reading(
        "Qwen3-0.6B, 64K", "1xh100 flash_attention_3, run 2026-01-15 (8718eb1)", QWEN3_0_6B, 1, 65536, 19.56
    ),
    Reading(
        "Qwen3-0.6B, 64K, inputs offloaded",
        "1xh100 Offload flash_attention_3, run 2026-01-15 (8718eb1)",
        QWEN3_0_6B,
        1,
        65536,
        16.084,
        offload=True,
    ),
    Reading(
        "Qwen3-0.6B, 16K, RTX A6000",
        "1xa6000 flash_attention_2, run 2026-01-15",
        QWEN3_0_6B,
        1,
        16384,
        12.469,
    ),
    Reading(
        "Qwen3-0.6B, 64K, RTX A6000",
        "1xa6000 flash_attention_2, trainer a76eec30",
        QWEN3_0_6B,
        1,
        65536,
        19.504,
    ),
    Reading(
        "Qwen3-0.6B, 64K, 4 GPUs", "4xa6000 flash_attention_2, trainer a76eec30", QWEN3_0_6B, 4, 65536, 12.355
    ),
    Reading(
        "Qwen3-4B, 16K, 8 GPUs",
        "8xh100 flash_attention_3, run 2026-01-15 (8718eb1)",
        QWEN3_4B,
        8,
        16384,
        17.096,
    ),
    Reading(
        "Qwen3-4B, 64K, 8 GPUs",
        "8xh100 flash_attention_3, run 2026-01-15 (8718eb1)",
        QWEN3_4B,
        8,
        65536,
        36.10,
    ),
    Reading(
        "Qwen3-4B, 16K, 8 B200", "8xb200 flash_attention_2, trainer bd087277", QWEN3_4B, 8, 16384, 18.100
    ),
    Reading(
        "Qwen3-4B, 64K, 8 B200",
        "8xb200 flash_attention_2, trainer bd087277",
        QWEN3_4B,
        8,
        65536,
        39.029,
        wide=(
            "the same shape as the H100's 36.10 GiB three weeks later on another trainer commit and attention kernel "
            "(8% more; its 16K twin reads 6% more than the H100's too): the plan is 5.5% under the H100's reading"
        ),
    ),
]


def planned_update(reading: Reading) -> float:
    """The plan's update phase for the reading's settings, less what PyTorch's allocator does not see, in GiB."""
    cfg = resolve(
        "or1-7b",
        1,
        [
            "rollout.engine=hf",  # no vLLM on the trainer's GPUs
            "algorithm.kl.enabled=false",
            "model.gradient_checkpointing=true",
            "actor.remove_padding=true",
            f"actor.max_tokens_per_micro_batch={reading.seq}",
            "data.max_prompt_length=16",  # every position in the loss: 16 tokens of prompt, the rest response
            f"rollout.max_response_length={reading.seq - 16}",
            "actor.offload=false",
            f"actor.activation_offload={str(reading.offload).lower()}",
            f"trainer.devices_per_node={reading.gpus}",
        ],
    )
    plan = plan_stage(
        cfg, ModelShape.from_config(reading.model, reading.name), Device(reading.gpus, 80 * GIB)
    )
    update = next(p for p in plan.phases if p.name == "update")
    return sum(v for k, v in update.parts.items() if k not in ("context", "nccl")) / GIB


@pytest.mark.parametrize("reading", READINGS, ids=[r.name for r in READINGS])
def test_the_update_phase_is_the_measured_reserved_peak(reading):
    """Within 10% of each reading; at most two up to 20%, each with its reason."""
    ratio = planned_update(reading) / reading.reserved_gib
    assert abs(ratio - 1) <= (0.20 if reading.wide else 0.10), (reading.name, round(ratio, 3))


def test_at_most_two_readings_are_allowed_a_wider_band():
    assert len([r for r in READINGS if r.wide]) <= 2
