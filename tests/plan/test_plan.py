"""`or1 plan` and `or1 train`'s memory check: every shipped GPU recipe fits the GPUs it is written for, the schema's
memory defaults do not and the fix does, and a stage that cannot fit is refused before any worker starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from or1.cli import app
from or1.config.recipe import RECIPES_DIR, load_recipe, resolve, stage_names
from or1.errors import UserError
from or1.plan import memory
from or1.plan.advice import _candidates, smallest_fix, with_overrides
from or1.plan.gate import check_fits
from or1.plan.host import host_need
from or1.plan.lengths import LAST_STEPS, previous_stage_length, with_expected_length
from or1.plan.memory import GIB, ShardState
from or1.plan.model import read_model_shape
from or1.plan.phase import FRAGMENTATION, Phase
from or1.plan.rollout import CUDA_GRAPHS
from or1.plan.stage import Device, plan_stage
from or1.plan.table import format_stage, one_line, tight_line
from or1.tinyworld.architecture import TinyModelSpec

CONFIGS = (
    Path(__file__).parent / "configs"
)  # the public Qwen2 7B / 32B architectures (DeepSeek-R1-Distill-Qwen's)
H100 = Device.parse("8xH100-80GB")
runner = CliRunner()


def test_device_spellings():
    """A card the table knows is planned at the memory it gives to PyTorch, not the size on its box; a bare size is
    taken as usable."""
    assert Device.parse("8xH100-80GB") == Device(8, int(79.1 * GIB), "H100", nominal=80.0)
    assert Device.parse("8xH100-80GB").label == "8xH100-80GB (79.1 GiB usable)"
    assert Device.parse("8x80") == Device(8, 80 * GIB, "GPU")
    assert Device.parse("4x141").count == 4 and Device.parse("H200-141GB").count == 8
    assert Device.parse("H200-141GB").memory == 139 * GIB


@pytest.mark.parametrize("text", ["8x-5", "8x0", "0x80", "8xH100-", "x80", "8x80x80"])
def test_a_malformed_gpus_spelling_is_refused_with_the_expected_form(text):
    """`--gpus 8x-5` was planned as 8 GPUs named "8x" of 5 GiB ("8x8x-5GB"); a count or memory that is not a positive
    number is refused in one line naming the form."""
    with pytest.raises(UserError, match=r"expected COUNTxNAME-MEMORY such as 8xH100-80GB"):
        Device.parse(text)
    result = runner.invoke(app, ["plan", "--recipe", "or1-7b", "--gpus", text])
    assert result.exit_code == 2 and "8xH100-80GB" in result.output and "Traceback" not in result.output


# The GPUs each shipped GPU recipe is planned for (trainer.devices_per_node per node, trainer.nnodes nodes) and the
# config.json of its model: 80 GB H100s for the Skywork-OR1 recipes (DeepSeek-R1-Distill-Qwen's public Qwen2
# architectures), one H200 (~139 GiB usable) for tiny-gpu (the `or1 init-model` model: TinyModelSpec, 293 tokens).
DECLARED = {
    "or1-math-7b": ("qwen2-7b", 80),
    "or1-7b": ("qwen2-7b", 80),
    "or1-7b-preview": ("qwen2-7b", 80),
    "or1-7b-async": ("qwen2-7b", 80),
    "or1-32b": ("qwen2-32b", 80),
    "or1-32b-preview": ("qwen2-32b", 80),
    "tiny-gpu": ("or1-tiny", 139),
    "or1-1.5b-1gpu": ("qwen2-1.5b", 80),
}
MARGIN = 0.9  # the GPU-only terms (CUDA sdpa, vLLM's workspace) are estimates until a GPU run checks them
# The schema's memory settings: 8 padded full-length sequences per micro-batch, no checkpointing, state on the GPU.
SCHEMA_MEMORY = [
    "model.gradient_checkpointing=false",
    "actor.remove_padding=false",
    "actor.max_tokens_per_micro_batch=null",
    "actor.fsdp_cpu_offload=false",
]


def test_every_gpu_recipe_has_declared_gpus():
    shipped = sorted(
        p.stem for p in RECIPES_DIR.glob("*.yaml") if resolve(p.stem, 1).trainer.device == "cuda"
    )
    assert shipped == sorted(DECLARED)


@pytest.mark.parametrize("recipe", sorted(DECLARED))
def test_every_stage_of_a_shipped_gpu_recipe_fits_its_gpus(recipe):
    """As shipped, with a margin: `or1 train` would otherwise refuse the recipe on the GPUs it is written for."""
    config, gib = DECLARED[recipe]
    shape = read_model_shape(CONFIGS / f"{config}.json")
    for stage in range(1, len(stage_names(load_recipe(recipe)[1])) + 1):
        cfg = resolve(recipe, stage)
        r = cfg.rollout  # a separate placement's node also holds its rollout replicas' GPUs
        replicas = r.replicas * r.tensor_parallel_size if r.placement == "separate" else 0
        plan = plan_stage(cfg, shape, Device(cfg.trainer.devices_per_node + replicas, gib * GIB))
        assert plan.fits, format_stage(plan, None)
        assert plan.peak.peak <= MARGIN * gib * GIB, format_stage(plan, None)


def test_a_separate_placement_plans_the_trainer_and_the_replicas_apart():
    """or1-7b-async on 8 x 80 GB: 4 training GPUs hold a quarter of the FSDP2 state each and no vLLM; a replica's
    GPU holds vLLM alone (its 0.8 share); a placement asking for more GPUs than the node has is a problem."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    cfg = resolve("or1-7b-async", 2)
    plan = plan_stage(cfg, shape, H100)
    phases = {p.name: p for p in plan.phases}
    assert set(phases) == {"rollout replica", "log-probs", "update"}
    sync = {p.name: p for p in plan_stage(resolve("or1-7b", 2), shape, H100).phases}
    assert phases["update"].parts["params"] == 2 * sync["update"].parts["params"]  # 4 shards instead of 8
    replica = phases["rollout replica"].parts
    assert not any(k in replica for k in ("params", "adam", "actor"))
    vllm_parts = ("vllm weights", "vllm workspace", "graphs", "kv cache")
    assert sum(replica[k] for k in vllm_parts) == int(0.8 * H100.memory)
    assert plan.fits and not plan.problems
    crowded = plan_stage(resolve("or1-7b-async", 2, ["rollout.replicas=6"]), shape, H100)
    assert not crowded.fits and "needs 10 GPUs" in crowded.problems[0]


def test_tiny_config_is_the_tiny_model():
    shape = read_model_shape(CONFIGS / "or1-tiny.json")
    spec = TinyModelSpec()
    assert (shape.layers, shape.hidden, shape.heads, shape.kv_heads, shape.intermediate, shape.tied) == (
        spec.num_hidden_layers,
        spec.hidden_size,
        spec.num_attention_heads,
        spec.num_key_value_heads,
        spec.intermediate_size,
        True,
    )


@pytest.mark.parametrize(("recipe", "config"), [("or1-7b", "qwen2-7b"), ("or1-32b", "qwen2-32b")])
def test_schema_memory_settings_do_not_fit_and_the_fix_does(recipe, config):
    """8 padded full-length sequences per micro-batch without checkpointing cannot fit; the advice packs them under a
    token budget with checkpointing (and, for 32B, keeps the FSDP2 state on the host)."""
    shape = read_model_shape(CONFIGS / f"{config}.json")
    cfg = resolve(recipe, 2, SCHEMA_MEMORY)
    plan = plan_stage(cfg, shape, H100)
    assert not plan.fits and plan.peak.name == "update"
    advice = smallest_fix(cfg, shape, H100)
    assert advice is not None and advice.plan.fits
    assert advice.overrides["model.gradient_checkpointing"] is True
    assert advice.overrides.get("actor.fsdp_cpu_offload", False) is (recipe == "or1-32b")
    budget = advice.overrides["actor.max_tokens_per_micro_batch"]
    assert (
        budget >= cfg.data.max_prompt_length + cfg.rollout.max_response_length
    )  # a whole sequence still fits
    assert plan_stage(with_overrides(cfg, advice.overrides), shape, H100).fits
    # one step more budget would not fit: the advice is the largest budget
    larger = advice.overrides | {"actor.max_tokens_per_micro_batch": budget + 1024}
    assert not plan_stage(with_overrides(cfg, larger), shape, H100).fits


def test_32b_with_sequence_parallelism_8_fits_its_long_token_budget():
    """verl's Qwen2.5-32B DAPO setting: 2K prompts, 20K responses, SP 8, prompt + response tokens a GPU. The group's
    packed row is 180,224 tokens; its [T, T] mask, which the plan used to keep (30 GiB) and copy in the backward
    (60 GiB, update 134.5 GiB), is gone with packed attention from the sequences' boundaries."""
    shape = read_model_shape(CONFIGS / "qwen2-32b.json")
    settings = [
        "rollout.max_response_length=20480",
        "actor.sequence_parallel_size=8",
        "actor.max_tokens_per_micro_batch=22528",
    ]
    plan = plan_stage(resolve("or1-32b", 2, settings), shape, H100)
    assert plan.fits, format_stage(plan, None)
    update = next(p for p in plan.phases if p.name == "update")
    assert update.peak <= 0.6 * H100.memory, format_stage(plan, None)


def test_colocated_phases_take_turns_not_add_up():
    """The stage's peak is its largest phase; the rollout's vLLM share is not added to the update's."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    plan = plan_stage(resolve("or1-7b", 1), shape, H100)
    rollout = next(p for p in plan.phases if p.name == "rollout")
    assert rollout.parts["actor"] == 0  # actor.offload: the actor is on the host while vLLM samples
    assert plan.peak.peak == max(p.peak for p in plan.phases)


def test_kv_cache_that_cannot_hold_one_sequence_is_a_problem():
    shape = read_model_shape(CONFIGS / "qwen2-32b.json")
    plan = plan_stage(resolve("or1-32b", 2, ["rollout.gpu_memory_utilization=0.25"]), shape, H100)
    assert not plan.fits and any("cannot hold one" in p for p in plan.problems)


def test_plan_command_prints_each_stage(tmp_path):
    result = runner.invoke(
        app,
        [
            "plan",
            "--recipe",
            "or1-7b",
            "--gpus",
            "8xH100-80GB",
            "--model-config",
            str(CONFIGS / "qwen2-7b.json"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("  fits: peak") == 2 and "stage 2 on 8xH100-80GB" in result.output
    assert "DOES NOT FIT" not in result.output and "smallest change" not in result.output
    # without checkpointing the 32K stage does not fit, and the plan says so with the fix
    result = runner.invoke(
        app,
        [
            "plan",
            "--recipe",
            "or1-7b",
            "--stage",
            "2",
            "--gpus",
            "8xH100-80GB",
            "--model-config",
            str(CONFIGS / "qwen2-7b.json"),
            "--set",
            "model.gradient_checkpointing=false",
        ],
    )
    assert result.exit_code == 0, result.output
    assert result.output.count("DOES NOT FIT") == 1
    assert "smallest change that fits: --set model.gradient_checkpointing=true" in result.output


def test_plan_command_needs_a_config(tmp_path):
    recipe = write_recipe(tmp_path, tmp_path / "absent")
    result = runner.invoke(app, ["plan", "--recipe", str(recipe), "--gpus", "8x80"])
    assert result.exit_code == 2 and "--model-config" in result.output


def write_recipe(tmp_path: Path, model: Path) -> Path:
    """A one-stage recipe of a 7B-shaped model (its config.json only) on 8 GPUs per node."""
    recipe = tmp_path / "big.yaml"
    recipe.write_text(
        json.dumps(
            {
                "name": "big",
                "model": {"path": str(model)},
                "data": {"train_files": [str(tmp_path / "train.parquet")]},
                "trainer": {"devices_per_node": 8, "device": "cpu", "steps": 1},
                "rollout": {"engine": "vllm", "max_response_length": 4096},
                "stages": [{"name": "1"}],
            }
        )
    )
    return recipe


def test_train_refuses_a_stage_that_cannot_fit_before_any_worker(tmp_path, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "qwen2-7b.json").read_text())
    recipe = write_recipe(tmp_path, model)

    def no_ray(*_, **__):
        raise AssertionError("Ray started: the check must refuse before any worker")

    monkeypatch.setattr("or1.hybrid.cluster.ray_session", no_ray)
    result = runner.invoke(
        app, ["train", "--recipe", str(recipe), "--gpus", "8x24", "--run-dir", str(tmp_path)]
    )
    assert result.exit_code == 2, result.output
    line = " ".join(result.output.split())
    assert "stage 1 will not fit in GPU memory" in line and "24.0 GiB" in line and "--set" in line
    # the old --gpu-memory GIB still works, with a line naming --gpus
    old = runner.invoke(
        app, ["train", "--recipe", str(recipe), "--gpu-memory", "24", "--run-dir", str(tmp_path)]
    )
    assert (
        old.exit_code == 2 and "note: --gpu-memory is now --gpus" in old.output and "24.0 GiB" in old.output
    )
    # told to go on anyway, it passes the check and stops at the next pre-flight error (no data file here)
    result = runner.invoke(
        app,
        [
            "train",
            "--recipe",
            str(recipe),
            "--gpus",
            "24",
            "--no-plan-check",
            "--run-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 2 and "will not fit" not in result.output and "train.parquet" in result.output


def test_the_pre_flight_says_what_it_could_not_check(tmp_path, monkeypatch):
    def unreachable(*_, **__):
        raise OSError("the hub cannot be reached")

    monkeypatch.setattr("huggingface_hub.hf_hub_download", unreachable)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    cfg = resolve(str(write_recipe(tmp_path, Path("nobody/not-cached-anywhere"))), 1)
    line = check_fits(cfg, "80")
    assert line.startswith("stage 1: GPU memory not checked: no config.json for nobody/not-cached-anywhere")
    assert "--model-config" in line
    fetched = tmp_path / "fetched.json"
    fetched.write_text((CONFIGS / "qwen2-7b.json").read_text())
    monkeypatch.setattr(
        "huggingface_hub.hf_hub_download", lambda *_, **__: str(fetched)
    )  # a few KB, no weights
    with pytest.raises(UserError, match="stage 1 will not fit"):  # planned from the fetched 7B config.json
        check_fits(cfg, "24")


def test_a_plan_above_nine_tenths_of_the_gpu_fits_with_a_warning(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((CONFIGS / "qwen2-7b.json").read_text())
    # the HF engine: no vLLM share of the GPU, so the peak (the update) does not follow the GPU's size
    cfg = resolve(str(write_recipe(tmp_path, model)), 1, ["rollout.engine=hf"])
    peak = plan_stage(cfg, read_model_shape(model), Device(8, 1000 * GIB)).peak.peak
    roomy, tight = Device(8, int(peak / 0.8)), Device(8, int(peak / 0.95))
    assert not plan_stage(cfg, read_model_shape(model), roomy).tight
    plan = plan_stage(cfg, read_model_shape(model), tight)
    assert plan.fits and plan.tight
    assert "fits, TIGHT" in format_stage(plan, None) and "above 90%" in format_stage(plan, None)
    line = check_fits(cfg, f"{tight.memory / GIB}")
    assert line.startswith("stage 1 fits with little to spare") and "(95%, above 90%)" in line
    assert check_fits(cfg, f"{roomy.memory / GIB}") is None
    # or1 train prints the warning and goes on (to the next pre-flight error here: no data file)
    args = [
        "train",
        "--recipe",
        str(tmp_path / "big.yaml"),
        "--set",
        "rollout.engine=hf",
        "--run-dir",
        str(tmp_path),
    ]
    result = runner.invoke(app, [*args, "--gpus", str(tight.memory / GIB)])
    line = " ".join(result.output.split())
    assert "stage 1 fits with little to spare" in line and "train.parquet" in line, result.output


def test_the_reference_policy_is_counted_under_kl():
    """The float32 reference (algorithm.kl.enabled) is sharded like the actor: on the GPU in every phase but vLLM's
    start when the actor stays there, on the host between its own passes under actor.offload."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    settings = ["algorithm.kl.enabled=true", "actor.offload=false"]
    plan = plan_stage(resolve("or1-7b", 1, settings), shape, H100)
    shard = ShardState.of(shape, 8).parameters
    phases = {p.name: p for p in plan.phases}
    assert [p.name for p in plan.phases] == [
        "vllm start",
        "weight push",
        "rollout",
        "log-probs",
        "ref log-probs",
        "update",
    ]
    assert "ref" not in phases["vllm start"].parts  # built after vLLM starts
    assert all(phases[n].parts["ref"] == shard for n in ("weight push", "rollout", "log-probs", "update"))
    offloaded = {p.name: p for p in plan_stage(resolve("or1-7b", 1, settings[:1]), shape, H100).phases}
    assert offloaded["rollout"].parts["ref"] == offloaded["update"].parts["ref"] == 0
    assert offloaded["ref log-probs"].parts["ref"] == shard
    without = plan_stage(resolve("or1-7b", 1), shape, H100)
    assert all("ref" not in p.parts for p in without.phases) and "ref log-probs" not in {
        p.name for p in without.phases
    }


def test_expected_lengths_decide_the_verdict_and_the_worst_case_warns():
    """Short answers under micro-batches by count: the worst case (every sequence at the budget) does not fit, the
    expected one does: it fits with a warning that names the worst case, and or1 train goes on."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    settings = [
        "actor.max_tokens_per_micro_batch=null",
        "actor.micro_batch_size=16",
        "data.max_prompt_length=1024",
        "rollout.max_response_length=1024",
        "actor.fused_head=false",  # the whole logits: what tips the worst case over
    ]
    two = Device.parse("2xH100-80GB")
    worst = plan_stage(resolve("or1-7b", 1, settings), shape, two)
    assert not worst.fits and worst.peak.name == "update"
    short = ["data.expected_prompt_length=200", "rollout.expected_response_length=300"]
    plan = plan_stage(resolve("or1-7b", 1, settings + short), shape, two)
    assert plan.fits and plan.tight and not plan.worst_fits
    assert plan.peak.peak == worst.peak.peak  # the worst case is still planned and shown
    text = format_stage(plan, None)
    assert "sequences of 200 + 300 tokens expected (the recipe), 1,024 + 1,024 at worst" in text
    assert "a step whose responses all run to the budget would not fit" in text
    assert "at the worst case" in tight_line(plan) and "actor.max_tokens_per_micro_batch" in tight_line(plan)
    # a token budget bounds the micro-batch's tokens whatever the lengths; the head's rows (the scored positions)
    # follow the response share: with the whole logits the update is 0.89x the worst case's, fused 0.999x
    whole = plan_stage(resolve("or1-7b", 1, [*short, "actor.fused_head=false"]), shape, H100)
    assert all(0.85 * p.peak <= p.expected_peak <= p.peak for p in whole.phases)
    fused = plan_stage(resolve("or1-7b", 1, short), shape, H100)
    assert all(0.95 * p.peak <= p.expected_peak <= p.peak for p in fused.phases)


def test_the_previous_stage_gives_the_expected_response_length(tmp_path):
    metrics = tmp_path / "stage1" / "metrics.jsonl"
    metrics.parent.mkdir()
    rows = [{"step": i, "response/length_mean": 1000.0 if i < 5 else 3000.0} for i in range(5 + LAST_STEPS)]
    metrics.write_text("\n".join(json.dumps(r) for r in rows) + "\n{torn")
    assert previous_stage_length(tmp_path, 2) == 3000.0  # its last LAST_STEPS steps
    assert previous_stage_length(tmp_path, 1) is None and previous_stage_length(tmp_path, 3) is None
    cfg, source = with_expected_length(resolve("or1-7b", 2), tmp_path)
    assert cfg.rollout.expected_response_length == 3000 and source.startswith(
        "stage 1's mean response length"
    )
    given, source = with_expected_length(
        resolve("or1-7b", 2, ["rollout.expected_response_length=500"]), tmp_path
    )
    assert given.rollout.expected_response_length == 500 and source == "the recipe"


def test_host_memory_is_checked_per_node():
    """FSDP2's CPU offload keeps float32 parameters, gradients and both moments of a node's ranks in its memory:
    about 525 GB for the 32B recipe (16 bytes a parameter); every rank loads the whole float32 model first."""
    shape = read_model_shape(CONFIGS / "qwen2-32b.json")
    cfg = resolve("or1-32b", 2)
    need = host_need(cfg, shape, 8, 8)
    assert need.parts["actor (fsdp-cpu)"] == 8 * 4 * ShardState.of(shape, 8).parameters
    assert 520e9 < need.parts["actor (fsdp-cpu)"] < 530e9
    assert need.load == 8 * 4 * shape.parameters
    small = dataclasses.replace(H100, host=512 * GIB)
    plan = plan_stage(cfg, shape, small)
    assert not plan.fits and any("host memory" in p for p in plan.problems)
    assert plan_stage(cfg, shape, dataclasses.replace(H100, host=2048 * GIB)).fits


def test_the_separate_placements_weights_in_flight_are_host_memory():
    """or1-7b-async (4 training GPUs, 4 replicas, k = 1) on a node: by the collective route each training rank keeps
    its bf16 shard of the k + 1 versions a step may sample with, and each replica stages up to k + 1 whole models;
    by the object store, k + 1 whole models sit in the store, each training rank gathers one to publish and each
    replica copies one out. Only the 4 training ranks load the float32 model."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    whole = 2 * shape.parameters
    collective, store = (
        plan_stage(resolve("or1-7b-async", 1, [f"rollout.weight_transfer={route}"]), shape, H100).host
        for route in ("collective", "object_store")
    )
    assert collective.parts["weight snapshots"] == 4 * 2 * memory.shard_bytes(shape, 4, 2)
    assert collective.parts["staged weights"] == 4 * 2 * whole
    assert store.parts["published weights"] == 2 * whole
    assert store.parts["gathered weights"] == store.parts["replica copies"] == 4 * whole
    assert collective.load == store.load == 4 * 4 * shape.parameters
    assert "weight snapshots" not in plan_stage(resolve("or1-7b", 1), shape, H100).host.parts


def test_a_node_without_the_host_memory_is_refused_in_one_line():
    shape = read_model_shape(CONFIGS / "qwen2-32b.json")
    plan = plan_stage(resolve("or1-32b", 2), shape, dataclasses.replace(H100, host=512 * GIB))
    line = one_line(plan, None)
    assert line.startswith(
        "stage 2 will not fit: a node needs 976 GiB of host memory (loading the model) of its 512"
    )
    assert "GPU memory" not in line


def test_plan_command_reads_a_run_and_checks_host_memory(tmp_path):
    (tmp_path / "stage1").mkdir()
    (tmp_path / "stage1" / "metrics.jsonl").write_text(
        json.dumps({"step": 1, "response/length_mean": 6000.0}) + "\n"
    )
    args = ["plan", "--recipe", "or1-7b", "--stage", "2", "--gpus", "8xH100-80GB"]
    args += ["--model-config", str(CONFIGS / "qwen2-7b.json"), "--run-dir", str(tmp_path)]
    result = runner.invoke(app, [*args, "--host-memory", "2048"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "sequences of 2,048 + 6,000 tokens expected (stage 1's mean response length" in text
    assert "host memory per node: 227.0 of 2048.0 GiB" in text and "fits: peak" in text
    result = runner.invoke(app, [*args, "--host-memory", "128"])
    assert "DOES NOT FIT" in result.output and "of its 128 GiB" in result.output


def test_the_fused_head_is_the_cheapest_lever_when_it_is_off():
    """Before checkpointing or any parallelism: it costs one head matmul recomputed, and at 32K it is a third of
    the update phase (or1-7b stage 2 on 8 x 80 GB: 55.5 -> 36.7 GiB)."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    cfg = resolve("or1-7b", 2, ["actor.fused_head=false"])
    candidates = _candidates(cfg, shape, H100)
    assert candidates[:2] == [{}, {"actor.fused_head": True}]
    whole, fused = (
        next(p.peak for p in plan_stage(resolve("or1-7b", 2, sets), shape, H100).phases if p.name == "update")
        for sets in (["actor.fused_head=false"], [])
    )
    assert fused <= 0.72 * whole


def test_the_verdict_holds_the_allocators_fragmentation():
    """A phase holds a tenth of the bytes its pass allocates and frees (gathered units, saved activations, the
    backward's transients) as fragmentation, and nothing for what stays (shards, moments, the engine's share): a
    stage whose expected peak fits only without it is refused."""
    phase = Phase(
        "update", {"params": 10 * GIB, "gathered": 2 * GIB, "activations": 6 * GIB, "backward": 2 * GIB}
    )
    assert phase.parts["fragmentation"] == int(FRAGMENTATION * 10 * GIB) and phase.peak == 21 * GIB
    assert "fragmentation" not in Phase("vllm start", {"actor": GIB, "vllm": 40 * GIB}).parts
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    cfg = resolve("or1-7b", 2, ["actor.fused_head=false"])  # the whole logits: the update is the peak
    update = plan_stage(cfg, shape, H100).expected_peak
    assert update.name == "update" and update.parts["fragmentation"] > GIB
    without = update.expected_peak - update.parts["fragmentation"]
    assert not plan_stage(cfg, shape, Device(8, without + GIB // 8)).fits
    assert plan_stage(cfg, shape, Device(8, update.expected_peak)).fits


def test_vllm_cuda_graphs_take_kv_cache_not_memory_beyond_the_share():
    """vLLM (0.21 and later) takes its CUDA graphs out of its gpu_memory_utilization share: with or without
    rollout.enforce_eager the engine holds its share while it samples, and without graphs its KV cache is larger by
    what they held; the weight push, where the graphs are awake beside the weights, holds them on top. The advice
    offers enforce_eager (more KV cache) where vLLM would capture graphs, never twice, never for the HF engine."""
    shape = read_model_shape(CONFIGS / "qwen2-7b.json")
    share = int(resolve("or1-7b", 1).rollout.gpu_memory_utilization * H100.memory)
    graphs, eager = (
        {p.name: p for p in plan_stage(resolve("or1-7b", 1, sets), shape, H100).phases}
        for sets in ([], ["rollout.enforce_eager=true"])
    )
    vllm_parts = ("vllm weights", "vllm workspace", "graphs", "kv cache")
    for plan in (graphs, eager):
        assert sum(plan["rollout"].parts[k] for k in vllm_parts) == share
        assert plan["vllm start"].parts["vllm"] == share
    assert graphs["rollout"].parts["graphs"] == CUDA_GRAPHS and eager["rollout"].parts["graphs"] == 0
    assert eager["rollout"].parts["kv cache"] - graphs["rollout"].parts["kv cache"] == CUDA_GRAPHS
    assert graphs["weight push"].peak - eager["weight push"].peak == CUDA_GRAPHS
    for name in ("vllm start", "rollout", "log-probs", "update"):
        assert graphs[name].peak == eager[name].peak
    replica = plan_stage(resolve("or1-7b-async", 2, ["rollout.enforce_eager=true"]), shape, H100).phases[0]
    assert replica.name == "rollout replica" and replica.parts["graphs"] == 0
    offered = [c for c in _candidates(resolve("or1-7b", 1), shape, H100) if c.get("rollout.enforce_eager")]
    assert offered and offered[0] == {"rollout.enforce_eager": True}  # alone first, then in combinations
    for sets in (["rollout.enforce_eager=true"], ["rollout.engine=hf"]):
        assert not any(
            "rollout.enforce_eager" in c for c in _candidates(resolve("or1-7b", 1, sets), shape, H100)
        )
