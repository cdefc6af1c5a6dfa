"""`or1 plan` against a second set of public configurations with known outcomes, none of them among the first
set's 13 (tests/plan/test_public.py, whose conventions apply): the scripts of projects that published their runs
(DeepScaleR, Logic-RL, SimpleRL-Zoo, TinyZero and a fork of it, a verl single-GPU example) and issues that report an
out-of-memory error with the script's settings.

One convention more: these projects ran verl's fork of vLLM 0.6.3 (their requirements pin `vllm<=0.6.3`), where
`gpu_memory_utilization` is a share of the memory still free after the models that exist at the engine's start and
its profile run (`verl/third_party/vllm/vllm_v_0_6_3/worker.py`, `determine_num_available_blocks`: "use the remaining
memory"), not of the card. verl builds the critic and the reference policy, then the actor and the engine, and AdamW's
moments come only with the first update; so at the engine's start a GPU holds the critic's float32 shard, the
reference's bf16 shard and the actor's float32 shard (each unless offloaded), vLLM's weights and its profile's
workspace. `share_of_free` turns such a share into the share of the card that vLLM then took, which is what or1's
`rollout.gpu_memory_utilization` means; the verl example of October 2025 (vLLM >= 0.8) keeps its share as it is.
Left out: reports without the card or the settings that ran (the A100 fork's script out of memory on A6000s of an
unknown count), and Logic-RL's out-of-memory on 4 A800s, which its reporter placed in a checkpoint save, no phase of
the plan.
"""

from __future__ import annotations

import pytest
from test_public import DISTILL_1_5B, QWEN_3B, QWEN_7B, QWEN_32B, Case, qwen2, verdict

from or1.plan.device import Device
from or1.plan.memory import shard_bytes
from or1.plan.model import ModelShape
from or1.plan.phase import CUDA_CONTEXT, NCCL_BUFFERS
from or1.plan.rollout import engine_weights

QWEN_MATH_1_5B = qwen2(28, 1536, 12, 2, 8960, 151936, True)  # Qwen2.5-Math-1.5B


def share_of_free(
    model: dict,
    gpus: str,
    share: float,
    tp: int,
    *,
    actor_on_gpu: bool = True,
    ref_on_gpu: bool = False,
    critic: bool = False,
) -> float:
    """The share of the card vLLM 0.6.3 took in verl when asked for `share` of the memory free at its start."""
    device = Device.parse(gpus)
    shape = ModelShape.from_config(model)
    world = device.count
    held = (
        CUDA_CONTEXT
        + NCCL_BUFFERS
        + (shard_bytes(shape, world) if actor_on_gpu else 0)  # float32
        + (shard_bytes(shape, world, dtype_bytes=2) if ref_on_gpu else 0)  # bf16
        + (shard_bytes(shape, world) if critic else 0)
    )
    engine = sum(engine_weights(shape, tp, device, 2))
    kv = share * (device.memory - held - engine)
    return round((engine + kv) / device.memory, 3)


# verl's fork in these projects: GRPO with a KL loss, vLLM without CUDA graphs, packed micro-batches, checkpointing
GRPO = [
    "rollout.engine=vllm",
    "rollout.enforce_eager=true",
    "model.gradient_checkpointing=true",
    "actor.remove_padding=true",
    "algorithm.kl.enabled=true",
]
# TinyZero's PPO: a critic of the same size, the KL in the reward, padded micro-batches, no checkpointing, nothing
# offloaded (its ppo_trainer.yaml defaults)
TINYZERO_PPO = [
    "rollout.engine=vllm",
    "rollout.enforce_eager=true",
    "model.gradient_checkpointing=false",
    "actor.remove_padding=false",
    "critic.remove_padding=false",
    "algorithm.advantage=gae",
    "algorithm.rejection_sampling=false",
    "algorithm.kl.enabled=true",
    "algorithm.kl.in_reward=true",
    "data.max_prompt_length=256",
    "rollout.max_response_length=1024",
    "rollout.tensor_parallel_size=2",
    "rollout.n=1",
]
# DeepScaleR's stages (run_deepscaler_1.5b_{8k,16k,24k}.sh): 32,768 tokens per micro-batch, the reference offloaded
DEEPSCALER = [
    *GRPO,
    "data.max_prompt_length=1024",
    "actor.max_tokens_per_micro_batch=32768",
    "rollout.tensor_parallel_size=1",
    "trainer.batch_size=128",
    "actor.ppo_mini_batch_size=64",
    f"rollout.gpu_memory_utilization={share_of_free(DISTILL_1_5B, '8xA100-80GB', 0.85, 1)}",
]
SIMPLERL = [
    *GRPO,
    "data.max_prompt_length=1024",
    "rollout.max_response_length=8192",
    "actor.micro_batch_size=2",
    "rollout.n=8",
    "trainer.batch_size=1024",
    "actor.ppo_mini_batch_size=256",
]

CASES = [
    Case(
        "DeepScaleR 1.5B, 8K responses, one node",
        "agentica-project/deepscaler scripts/train/run_deepscaler_1.5b_8k.sh (95ef74f; README: 8 A100-80GB)",
        True,
        DISTILL_1_5B,
        "8xA100-80GB",
        [*DEEPSCALER, "rollout.max_response_length=8192", "rollout.n=8"],
    ),
    Case(
        "DeepScaleR 1.5B, 16K responses, four nodes",
        "agentica-project/deepscaler scripts/train/run_deepscaler_1.5b_16k.sh (README: 4 nodes of 8 A100-80GB)",
        True,
        DISTILL_1_5B,
        "8xA100-80GB",
        [*DEEPSCALER, "rollout.max_response_length=16384", "rollout.n=16"],
        nodes=4,
    ),
    Case(
        "DeepScaleR 1.5B, 24K responses, four nodes",
        "agentica-project/deepscaler scripts/train/run_deepscaler_1.5b_24k.sh (README: 4 nodes of 8 A100-80GB)",
        True,
        DISTILL_1_5B,
        "8xA100-80GB",
        [*DEEPSCALER, "rollout.max_response_length=24576", "rollout.n=16"],
        nodes=4,
    ),
    Case(
        "Logic-RL 7B GRPO, four GPUs, everything offloaded",
        "Unakar/Logic-RL main_grpo.sh (9d2c457; README: 4xA100 80G; issue 52)",
        True,
        QWEN_7B,
        "4xA100-80GB",
        [
            *GRPO,
            "data.max_prompt_length=400",
            "rollout.max_response_length=2048",
            "actor.micro_batch_size=4",
            "actor.offload=true",
            "rollout.tensor_parallel_size=1",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_7B, '4xA100-80GB', 0.6, 1, actor_on_gpu=False)}",
            "rollout.n=16",
            "trainer.batch_size=64",
            "actor.ppo_mini_batch_size=32",
        ],
    ),
    Case(
        "SimpleRL-Zoo 7B, two nodes",
        "hkust-nlp/simpleRL-reason README and train_grpo_math_tune_ray.sh (a89537d): 2x8 H100-80G",
        True,
        QWEN_7B,
        "8xH100-80GB",
        [
            *SIMPLERL,
            "rollout.tensor_parallel_size=2",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_7B, '8xH100-80GB', 0.75, 2)}",
        ],
        nodes=2,
    ),
    Case(
        "SimpleRL-Zoo 32B, eight nodes",
        "hkust-nlp/simpleRL-reason README and train_grpo_math_tune_ray.sh (a89537d): 8x8 H100-80G",
        True,
        QWEN_32B,
        "8xH100-80GB",
        [
            *SIMPLERL,
            "rollout.tensor_parallel_size=8",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_32B, '8xH100-80GB', 0.75, 8)}",
        ],
        nodes=8,
    ),
    Case(
        "verl's single-H100 GRPO of Qwen2.5-Math-1.5B",
        "volcengine/verl 4ca6dcd examples/tuning/1.5b/qwen2.5math-1.5b_grpo_1_h100_fsdp_vllm.sh (MATH500 77.8)",
        True,
        QWEN_MATH_1_5B,
        "1xH100-80GB",
        [
            "rollout.engine=vllm",
            "model.gradient_checkpointing=true",
            "actor.remove_padding=true",
            "algorithm.entropy.mode='off'",
            "data.max_prompt_length=1024",
            "rollout.max_response_length=3000",
            "actor.micro_batch_size=4",
            "rollout.tensor_parallel_size=1",
            "rollout.gpu_memory_utilization=0.4",
            "rollout.n=8",
            "trainer.batch_size=256",
            "actor.ppo_mini_batch_size=256",
        ],
    ),
    Case(
        "TinyZero's 3B PPO on two H100s",
        "Jiayi-Pan/TinyZero scripts/train_tiny_zero.sh (README: N_GPUS=2, ROLLOUT_TP_SIZE=2); issue 30: out of memory",
        False,
        QWEN_3B,
        "2xH100-80GB",
        [
            *TINYZERO_PPO,
            "actor.micro_batch_size=4",
            "critic.micro_batch_size=4",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_3B, '2xH100-80GB', 0.4, 2, ref_on_gpu=True, critic=True)}",
            "trainer.batch_size=256",
            "actor.ppo_mini_batch_size=128",
        ],
    ),
    Case(
        "the same 3B PPO on two H200s",
        "Jiayi-Pan/TinyZero issue 30 (reproduced on H200s, 141GB, with the repository's default parameters)",
        True,
        QWEN_3B,
        "2xH200-141GB",
        [
            *TINYZERO_PPO,
            "actor.micro_batch_size=4",
            "critic.micro_batch_size=4",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_3B, '2xH200-141GB', 0.4, 2, ref_on_gpu=True, critic=True)}",
            "trainer.batch_size=256",
            "actor.ppo_mini_batch_size=128",
        ],
    ),
    Case(
        "TinyZero's A100 fork: the 3B PPO on two A100s, smaller micro-batches",
        "JerryWu-code/TinyZero scripts/train_tiny_zero_a100_ppo.sh (e81c5a2; TinyZero issue 30: works on two 80 GB cards)",
        True,
        QWEN_3B,
        "2xA100-80GB",
        [
            *TINYZERO_PPO,
            "actor.micro_batch_size=2",
            "critic.micro_batch_size=2",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_3B, '2xA100-80GB', 0.4, 2, ref_on_gpu=True, critic=True)}",
            "trainer.batch_size=128",
            "actor.ppo_mini_batch_size=64",
        ],
    ),
    Case(
        "ToolRL 7B GRPO on two 80 GB GPUs",
        "qiancheng0/ToolRL examples/grpo_trainer/run_grpo.sh (8cee13e) with issue 53's settings (80 GB cards of an "
        "unnamed kind): out of memory",
        False,
        QWEN_7B,
        "2xA100-80GB",
        [
            *GRPO,
            "algorithm.kl.in_reward=true",
            "data.max_prompt_length=2048",
            "rollout.max_response_length=1024",
            "actor.max_tokens_per_micro_batch=16384",
            "rollout.tensor_parallel_size=2",
            f"rollout.gpu_memory_utilization={share_of_free(QWEN_7B, '2xA100-80GB', 0.6, 2)}",
            "rollout.n=4",
            "trainer.batch_size=512",
            "actor.ppo_mini_batch_size=64",
        ],
    ),
]


def test_the_second_set_is_new_and_has_both_outcomes():
    from test_public import CASES as FIRST

    assert len(CASES) >= 10 and not {c.source for c in CASES} & {c.source for c in FIRST}
    assert sum(not c.ran for c in CASES) >= 2 and sum(c.ran for c in CASES) >= 2


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_plan_agrees_with_each_outcome(case, base_recipe):
    fits, table = verdict(case, base_recipe)
    assert fits == case.ran, f"{case.source}\n{table}"
