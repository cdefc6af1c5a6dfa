"""The shipped recipes say exactly what their sources say, each value next to the source it comes from.

Sources: the stage tables of the Skywork-OR1 technical report (He et al., arXiv 2505.22312), and the released training
scripts of the SkyworkAI/Skywork-OR1 repository, or1_scripts/train/{7b,32b}_{8k,16k,32k}.sh (commit 64e96af).
"""

from pathlib import Path

import pytest

from or1.config.recipe import RECIPES_DIR, load_recipe, resolve, stage_names

K = 1024

# (recipe, stage): (global step range, context, batch, mini-batch, group): the technical report's stage tables.
RELEASED = {
    ("or1-math-7b", 1): ((0, 740), 8 * K, 256, 128, 16),
    ("or1-math-7b", 2): ((740, 1740), 16 * K, 256, 128, 16),
    ("or1-math-7b", 3): ((1740, 2080), 32 * K, 256, 128, 16),
    ("or1-math-7b", 4): ((2080, 2160), 32 * K, 128, 64, 64),
    ("or1-7b", 1): ((0, 660), 16 * K, 256, 256, 16),
    ("or1-7b", 2): ((660, 1320), 32 * K, 160, 160, 32),
    ("or1-32b", 1): ((0, 760), 16 * K, 256, 256, 16),
    ("or1-32b", 2): ((760, 1130), 24 * K, 160, 160, 32),
}


@pytest.mark.parametrize(("recipe", "stage"), sorted(RELEASED))
def test_released_stage_tables(recipe, stage):
    (start, end), context, batch, mini, group = RELEASED[(recipe, stage)]
    config = resolve(recipe, stage)
    assert (config.stage.start_step, config.stage.start_step + config.trainer.steps) == (start, end)
    assert config.rollout.max_response_length == context
    assert (config.trainer.batch_size, config.actor.ppo_mini_batch_size, config.rollout.n) == (
        batch,
        mini,
        group,
    )


def test_math_7b_stage_names_follow_the_paper():
    assert stage_names(load_recipe("or1-math-7b")[1]) == ["1", "2", "3", "3.5"]


@pytest.mark.parametrize(("size", "tp"), [("7b", 1), ("32b", 2)])
def test_preview_recipes(size, tp):
    contexts = [resolve(f"or1-{size}-preview", s).rollout.max_response_length for s in (1, 2, 3)]
    assert contexts == [8 * K, 16 * K, 32 * K]
    for stage in (1, 2, 3):
        config = resolve(f"or1-{size}-preview", stage)
        assert (config.data.max_prompt_length, config.trainer.batch_size, config.rollout.n) == (2048, 256, 16)
        assert config.rollout.tensor_parallel_size == tp and config.actor.offload
        assert (config.trainer.save_every, config.data.validation.every, config.trainer.devices_per_node) == (
            20,
            20,
            8,
        )
        # The repository's entropy knobs are what the preview scripts used.
        entropy = config.algorithm.entropy
        assert (entropy.target, entropy.delta, entropy.max_coef, entropy.min_coef) == (
            0.2,
            0.0001,
            0.005,
            0.0,
        )
        assert config.trainer.steps is None  # the scripts switched stages case by case
        assert entropy.timing == "repository"
    assert resolve(f"or1-{size}-preview", 3).actor.sequence_parallel_size == (2 if size == "32b" else 1)


# What every released script sets (SkyworkAI/Skywork-OR1 or1_scripts/train/*.sh, the same in all six):
#   ENTROPY_COEFF=0.0, TGT_ENTROPY=0.2, DELTA_ENT_COEF=0.0001, MAX_ENT_COEF=0.005, MIN_ENT_COEF=0  -> algorithm.entropy
#   MAX_PROMPT_LENGTH=2048, actor.optim.lr=1e-6, TRAIN_TEMPERATURE=1.0, N_VAL_SAMPLES=8, val_temperature=0.6,
#   save_freq=20, test_freq=20, n_gpus_per_node=8, fsdp_config.param_offload=True
# and the per-size tensor parallel size: TP=1 in 7b_*.sh, TP=2 in 32b_*.sh.
SCRIPTS = {
    "entropy": {"target": 0.2, "init_coef": 0.0, "delta": 0.0001, "max_coef": 0.005, "min_coef": 0.0},
    "max_prompt_length": 2048,
    "lr": 1e-6,
    "temperature": 1.0,
    "validation_n": 8,
    "validation_temperature": 0.6,
    "save_every": 20,
    "validate_every": 20,
    "devices_per_node": 8,
    "offload": True,
}
SCRIPT_TP = {"7b": 1, "32b": 2}
AS_RELEASED = ("or1-math-7b", "or1-7b", "or1-32b")


@pytest.mark.parametrize("recipe", AS_RELEASED)
def test_as_released_recipes_follow_the_released_scripts(recipe):
    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        config = resolve(recipe, stage)
        entropy = config.algorithm.entropy
        assert {k: getattr(entropy, k) for k in SCRIPTS["entropy"]} == SCRIPTS["entropy"]
        # the repository's code switches the bonus on the previous step's entropy estimate
        assert entropy.mode == "adaptive" and entropy.timing == "repository"
        validation = config.data.validation
        assert (
            config.data.max_prompt_length,
            config.actor.lr,
            config.rollout.temperature,
            validation.n,
            min(validation.temperatures),
            config.trainer.save_every,
            validation.every,
            config.trainer.devices_per_node,
            config.actor.offload,
        ) == tuple(v for k, v in SCRIPTS.items() if k != "entropy")
        assert config.rollout.tensor_parallel_size == SCRIPT_TP[recipe.rsplit("-", 1)[1]]


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("or1-*.yaml")))
def test_real_recipes_use_the_released_memory_settings(recipe):
    # Every released script: enable_gradient_checkpointing=True, use_remove_padding=True, use_dynamic_bsz=True with
    # ppo_max_token_len_per_gpu = (prompt + response + 1000) / SP; 32B offloads parameters, gradients and optimizer
    # (or1: actor.fsdp_cpu_offload, which `or1 plan` needs for 32B on one node of 8 x 80 GB, tests/plan).
    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        config = resolve(recipe, stage)
        actor = config.actor
        assert config.model.gradient_checkpointing and actor.remove_padding
        seq = config.data.max_prompt_length + config.rollout.max_response_length
        assert actor.max_tokens_per_micro_batch == -(-(seq + 1000) // actor.sequence_parallel_size)
        assert actor.fsdp_cpu_offload == ("32b" in recipe) and config.trainer.nnodes == 1


@pytest.mark.parametrize("recipe", AS_RELEASED)
def test_the_papers_entropy_control_is_one_override_away(recipe):
    # The paper (section on adaptive entropy control): delta 0.005, no upper bound, the switch of step k uses e_k.
    entropy = resolve(recipe, 1, ["algorithm.entropy={}"]).algorithm.entropy
    assert (entropy.target, entropy.delta, entropy.max_coef, entropy.timing) == (0.2, 0.005, None, "paper")


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("or1-*.yaml")))
def test_real_recipes_use_the_paper_algorithm(recipe):
    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        config = resolve(recipe, stage)
        algo, actor, rollout = config.algorithm, config.actor, config.rollout
        assert algo.advantage == "grpo" and algo.norm_adv_by_std and algo.rejection_sampling
        assert not algo.kl.enabled and algo.truncated == "zero_reward" and algo.online_filter
        assert (actor.lr, actor.grad_clip, actor.ppo_epochs, actor.loss_agg_mode) == (
            1e-6,
            1.0,
            1,
            "token-mean",
        )
        assert (actor.clip_ratio_low, actor.clip_ratio_high) == (0.2, 0.2)
        assert (rollout.temperature, rollout.top_p) == (1.0, 1.0)
        assert (
            algo.entropy.mode == "adaptive" and algo.entropy.target == 0.2 and algo.entropy.init_coef == 0.0
        )
        # every recipe follows the released scripts' entropy knobs (see SCRIPTS above)
        assert (algo.entropy.delta, algo.entropy.max_coef, algo.entropy.timing) == (
            0.0001,
            0.005,
            "repository",
        )
        validation = config.data.validation
        assert (
            validation.sets == ["aime24", "aime25"]
            and validation.n == 8
            and validation.temperatures == [0.6, 1.0]
        )


def _leaves(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _leaves(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


# What the GPU variant of the tiny recipe changes, and nothing else.
TINY_GPU_CHANGES = {
    "recipe": ("tiny", "tiny-gpu"),
    "model.dtype": ("float32", "bfloat16"),
    "rollout.engine": ("hf", "vllm"),
    "rollout.gpu_memory_utilization": (0.6, 0.3),
    "actor.offload": (False, True),
    "trainer.devices_per_node": (2, 1),
    "trainer.device": ("cpu", "cuda"),
    "algorithm.rollout_correction.is_level": ("off", "token"),  # a bfloat16 sampler beside float32 weights
}


def test_tiny_gpu_is_the_tiny_recipe_on_one_gpu_with_vllm():
    assert stage_names(load_recipe("tiny-gpu")[1]) == stage_names(load_recipe("tiny")[1])
    for stage in (1, 2, 3):
        cpu, gpu = (
            _leaves(resolve("tiny", stage).model_dump()),
            _leaves(resolve("tiny-gpu", stage).model_dump()),
        )
        assert cpu.keys() == gpu.keys()
        changed = {k: (cpu[k], gpu[k]) for k in cpu if cpu[k] != gpu[k]}
        assert changed == TINY_GPU_CHANGES


OR1_7B_ASYNC_CHANGES = {
    "recipe": ("or1-7b", "or1-7b-async"),
    "trainer.devices_per_node": (8, 4),
    "actor.offload": (True, False),
    "rollout.placement": ("colocated", "separate"),
    "rollout.replicas": (1, 4),
    "rollout.max_staleness": (0, 1),
    "rollout.gpu_memory_utilization": (0.6, 0.8),
}


def test_or1_7b_async_is_or1_7b_on_a_separate_placement():
    """Only the placement and the staleness differ: the same model, data, algorithm (its TIS included) and stages."""
    assert stage_names(load_recipe("or1-7b-async")[1]) == stage_names(load_recipe("or1-7b")[1])
    for stage in (1, 2):
        sync, async_ = (
            _leaves(resolve("or1-7b", stage).model_dump()),
            _leaves(resolve("or1-7b-async", stage).model_dump()),
        )
        assert sync.keys() == async_.keys()
        assert {k: (sync[k], async_[k]) for k in sync if sync[k] != async_[k]} == OR1_7B_ASYNC_CHANGES


GPU_RECIPES = sorted(
    p.stem for p in RECIPES_DIR.glob("*.yaml") if resolve(p.stem, 1).trainer.device == "cuda"
)


def test_every_gpu_recipe_is_known():
    assert GPU_RECIPES == [
        "or1-1.5b-1gpu",
        "or1-32b",
        "or1-32b-preview",
        "or1-7b",
        "or1-7b-async",
        "or1-7b-preview",
        "or1-math-7b",
        "tiny-gpu",
    ]


@pytest.mark.parametrize("recipe", GPU_RECIPES)
def test_gpu_recipes_build_their_fsdp_policies(recipe):
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    from or1.engines.train_settings import TrainSettings, fsdp_policies

    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        config = resolve(recipe, stage)
        settings = TrainSettings.from_config(config, device="cuda:0")
        # float32 master weights, bfloat16 compute, float32 gradient reduction; offload between phases where the
        # actor shares its GPUs with the rollout engine
        assert (settings.dtype, settings.mixed_precision, settings.compute_dtype) == (
            "float32",
            "bfloat16",
            "bfloat16",
        )
        assert settings.offload == (config.rollout.placement == "colocated")
        assert settings.fsdp_cpu_offload == config.actor.fsdp_cpu_offload == recipe.startswith("or1-32b")
        assert settings.gradient_checkpointing == config.model.gradient_checkpointing
        policies = fsdp_policies(settings)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        assert policies["mp_policy"] == mp
        assert ("offload_policy" in policies) == settings.fsdp_cpu_offload
        pinned = fsdp_policies(
            TrainSettings.from_config(resolve(recipe, stage, ["actor.fsdp_cpu_offload=true"]), device="cuda")
        )
        assert isinstance(pinned["offload_policy"], CPUOffloadPolicy) and pinned["offload_policy"].pin_memory
        # the critic (GAE) has no offload settings; on the CPU everything is float32 whatever the recipe says
        critic = TrainSettings.from_config(config, config.critic, device="cuda")
        assert (critic.mixed_precision, critic.offload) == ("bfloat16", False)
        on_cpu = TrainSettings.from_config(config, device="cpu")
        assert (on_cpu.dtype, on_cpu.mixed_precision, on_cpu.offload, fsdp_policies(on_cpu)) == (
            "float32",
            None,
            False,
            {},
        )


def test_gpu_settings_on_a_cpu_engine_are_refused():
    import torch
    import torch.distributed as dist

    from or1.engines.fsdp import FSDPEngine
    from or1.engines.train_settings import TrainSettings

    settings = TrainSettings(device="cpu", mixed_precision="bfloat16")
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:0", rank=0, world_size=1)
    try:
        with pytest.raises(ValueError, match="mixed precision and offload are CUDA settings"):
            FSDPEngine(torch.nn.Linear(2, 2), settings)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES_DIR.glob("*.yaml")))
def test_stop_rules_read_the_stages_own_validation_sets_and_the_last_stage_has_none(recipe):
    """A rule's set is one the stage validates (a benchmark's name or a file's stem; docs/stage-ends.md)."""
    stages = len(stage_names(load_recipe(recipe)[1]))
    for stage in range(1, stages + 1):
        cfg = resolve(recipe, stage, ["trainer.steps=1"])
        sets = {Path(str(getattr(e, "set", e))).stem for e in cfg.data.validation.sets}
        until = cfg.trainer.until
        for rule in (until.plateau, until.target):
            assert rule is None or rule.set is None or rule.set in sets
        if stage == stages:
            assert until == type(until)(), "nothing follows the last stage: it runs its steps"
