"""Activation offload (or1/engines/activation_offload.py): the same losses and gradients, bit for bit, with the
checkpointed blocks' inputs in a second (host) buffer; what autograd keeps on the compute device drops by their size;
through FSDPPolicyEngine on 2 gloo ranks the same step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp_engine import make_batch
from transformers import Qwen2Config, Qwen2ForCausalLM

from gloo_ranks import spawn_ranks
from or1.algos.losses import LossConfig
from or1.config.recipe import resolve
from or1.engines import activation_offload, varlen
from or1.engines.activation_offload import HostInputs
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.fused_head import fused_head
from or1.engines.packing import packed_window
from or1.engines.train_settings import TrainSettings

CONFIG = dict(
    vocab_size=301,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=1024,
)


def model(offload: HostInputs | None) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    m = Qwen2ForCausalLM(Qwen2Config(**CONFIG, dtype="float32"))
    m.train()
    varlen.enable(m)
    if offload is None:
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        activation_offload.checkpoint_blocks(m, lambda: offload)
    return m


def window():
    micro = make_batch(8, seed=3).tensors
    return packed_window(micro)


def loss_of(m: Qwen2ForCausalLM, w) -> torch.Tensor:
    out = m(**w.inputs, use_cache=False, logits_to_keep=1, output_hidden_states=True)
    hidden = w.picked(out.hidden_states[-1])
    log_probs, entropy = fused_head(hidden, m.lm_head.weight, w.targets, 0.9, chunk=16, with_entropy=True)
    return -(log_probs * torch.linspace(-1, 1, log_probs.shape[-1])).sum() - 0.01 * entropy.sum()


def device_saved_bytes(m: Qwen2ForCausalLM, w) -> tuple[int, torch.Tensor]:
    """Distinct storages autograd keeps outside the offload (what stays on the compute device), parameters left
    out, and the loss."""
    params = {p.untyped_storage().data_ptr() for p in m.parameters()}
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_of(m, w)
    return sum(storages.values()), loss


def test_offloaded_inputs_give_the_same_loss_and_gradients_bit_for_bit():
    w = window()
    plain, store = model(None), HostInputs(min_bytes=0)
    offloaded = model(store)
    kept, loss = device_saved_bytes(plain, w)
    kept_offloaded, loss_offloaded = device_saved_bytes(offloaded, w)
    # every block's hidden-state input went to the host (rotary tables: one copy for all blocks)
    tokens = w.inputs["input_ids"].shape[1]
    inputs = CONFIG["num_hidden_layers"] * tokens * CONFIG["hidden_size"] * 4
    assert store.held_bytes >= inputs
    assert kept - kept_offloaded >= inputs
    assert all(h.host.device.type == "cpu" for h in store.held)
    loss.backward()
    loss_offloaded.backward()
    assert torch.equal(loss, loss_offloaded)
    for (name, p), q in zip(plain.named_parameters(), offloaded.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name
    assert all(h.back is None for h in store.held)  # nothing left on the device after the backward


def test_a_shared_input_is_copied_once_and_a_freed_one_is_never_matched():
    store = HostInputs(min_bytes=0)
    shared = torch.randn(4, 8)
    assert store.pack(shared) == store.pack(shared) == 0  # one host copy, two uses
    first = store.pack(torch.randn(4, 8))
    second = store.pack(torch.randn(4, 8))  # may reuse the freed first tensor's memory and id
    assert first != second and len(store.held) == 3
    assert torch.equal(store.unpack(0), shared) and store.held[0].back is not None  # one use left
    store.unpack(0)
    assert store.held[0].back is None


def test_offload_needs_checkpointing():
    with pytest.raises(Exception, match="needs model.gradient_checkpointing"):
        resolve("tiny", 1, ["actor.activation_offload=true", "model.gradient_checkpointing=false"])


def _rank(rank: int, world: int, init_file: str, model_dir: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    activation_offload.MIN_BYTES = 0  # the tiny model's inputs are small: offload every one
    results = []
    for offload in (False, True):
        settings = TrainSettings(
            lr=1e-3,
            micro_batch_size=3,
            remove_padding=True,
            gradient_checkpointing=True,
            activation_offload=offload,
        )
        engine = FSDPPolicyEngine(model_dir, settings)
        batch = make_batch(8).chunk(world)[rank]
        metrics = engine.train_step(batch, LossConfig(), temperature=1.0, entropy_coef=0.01)
        held = len(engine.host_inputs.held)  # the last micro-batch's offloaded inputs
        results.append((metrics, {n: t.clone() for n, t in engine.named_full_params()}, held))
    if rank == 0:
        torch.save(results, out_file)


def test_the_engine_takes_the_same_step_with_offload_on_two_ranks(tmp_path: Path, model_dir: Path):
    out = tmp_path / "out.pt"
    spawn_ranks(_rank, 2, str(tmp_path / "pg"), str(model_dir), str(out), nprocs=2)
    (plain, plain_params, none), (offloaded, offloaded_params, held) = torch.load(out, weights_only=False)
    assert none == 0 and held >= 2  # each block's input went through the host
    assert plain == offloaded
    for name, value in plain_params.items():
        assert torch.equal(offloaded_params[name], value), name
