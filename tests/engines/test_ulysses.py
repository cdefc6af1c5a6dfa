"""Ulysses sequence parallelism: a packed batch split over 2 gloo ranks gives the log-probs, loss and gradients of
each sequence run alone through the plain transformers model (plain modules, no FSDP: the engine test covers that)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from transformers import Qwen2Config, Qwen2ForCausalLM

from gloo_ranks import spawn_ranks
from or1.algos.losses import token_log_probs
from or1.engines import ulysses
from or1.engines.varlen import Segments
from or1.errors import UserError

LENGTHS = (7, 12, 1, 3, 8)  # 31 tokens, one sequence of a single token: SP=2 pads one dummy token
KV_HEADS = (2, 1)  # 1: fewer key/value heads than SP ranks, so they are repeated


def make_model(kv_heads: int) -> Qwen2ForCausalLM:
    """The engine tests' tiny shape (4 heads), with 2 key/value heads or 1 (fewer than the SP ranks)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        intermediate_size=128,
    )
    return Qwen2ForCausalLM(config)


def sequences() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, 64, (n,), generator=g) for n in LENGTHS]


def reference(kv_heads: int) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """Each sequence alone through the unmodified model: next-token log-probs, their mean NLL and its gradients."""
    model = make_model(kv_heads)
    log_probs = [
        token_log_probs(model(input_ids=seq[None], use_cache=False).logits[:, :-1], seq[None, 1:])[0]
        for seq in sequences()
    ]
    loss = -torch.cat(log_probs).mean()
    loss.backward()
    return torch.cat(log_probs).detach(), loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def sp_step(kv_heads: int, group: dist.ProcessGroup | None) -> dict:
    """This rank's slice of the packed row through the model, the gathered loss, backward; gradients summed over
    the group (what FSDP's reduce does, up to its 1/world that the engine's loss scale cancels)."""
    model = make_model(kv_heads)
    ulysses.enable(model)
    seqs = sequences()
    ids = torch.cat(seqs)[None]
    positions = torch.cat([torch.arange(len(s)) for s in seqs])[None]
    # targets: the next token of the same sequence; a sequence's last token predicts nothing (weight 0)
    targets = torch.cat([torch.cat([s[1:], s[:1]]) for s in seqs])[None]
    weights = torch.cat([torch.cat([torch.ones(len(s) - 1), torch.zeros(1)]) for s in seqs])[None]
    padded_ids, padded_positions, segments = ulysses.pad_to_multiple(
        ids, positions, Segments(LENGTHS), ulysses.group_size(group)
    )
    padded_targets = torch.nn.functional.pad(targets, (0, padded_ids.shape[1] - ids.shape[1]))
    local_logits = model(
        input_ids=ulysses.local_slice(padded_ids, group),
        position_ids=ulysses.local_slice(padded_positions, group),
        segments=segments,
        sp_group=group,
        use_cache=False,
    ).logits
    local = token_log_probs(local_logits, ulysses.local_slice(padded_targets, group))
    log_probs = ulysses.gather(local, group)[:, : ids.shape[1]]
    loss = -(log_probs * weights).sum() / weights.sum()  # every rank: the whole group's loss
    loss.backward()
    grads = {}
    for name, param in model.named_parameters():
        if group is not None:
            dist.all_reduce(param.grad, group=group)
        grads[name] = param.grad
    return {"log_probs": log_probs[weights.bool()].detach(), "loss": loss.detach(), "grads": grads}


def _sp_rank(rank: int, init_file: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    torch.set_num_threads(1)
    results = {kv_heads: sp_step(kv_heads, dist.group.WORLD) for kv_heads in KV_HEADS}
    if rank == 0:
        torch.save(results, out_file)


@pytest.fixture(scope="module")
def two_sp_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("ulysses")
    spawn_ranks(_sp_rank, str(tmp / "pg"), str(tmp / "out.pt"))
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.parametrize("kv_heads", KV_HEADS)
def test_two_sp_ranks_equal_each_sequence_alone(two_sp_ranks: dict, kv_heads: int) -> None:
    expected_lp, expected_loss, expected_grads = reference(kv_heads)
    for got in (sp_step(kv_heads, None), two_sp_ranks[kv_heads]):  # SP=1 (the same code, one rank), SP=2
        torch.testing.assert_close(got["log_probs"], expected_lp, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got["loss"], expected_loss, atol=1e-6, rtol=1e-6)
        for name, grad in expected_grads.items():
            torch.testing.assert_close(got["grads"][name], grad, atol=1e-6, rtol=1e-4, msg=name)
    assert all(
        float(g.abs().max()) > 0 for g in expected_grads.values()
    )  # every weight has a gradient to match


def test_pad_to_multiple_appends_a_dummy_sequence() -> None:
    ids, positions, segments = ulysses.pad_to_multiple(
        torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 0]]), Segments((2, 1)), 4
    )
    assert ids.tolist() == [[5, 6, 7, 0]] and positions.tolist() == [[0, 1, 0, 0]]
    assert segments.lengths == (2, 1, 1)
    ids, positions, segments = ulysses.pad_to_multiple(
        torch.tensor([[5, 6, 7]]), torch.tensor([[0, 1, 2]]), Segments((3,)), 3
    )
    assert ids.tolist() == [[5, 6, 7]] and positions.tolist() == [[0, 1, 2]] and segments.lengths == (3,)


@pytest.mark.parametrize(("heads", "kv_heads", "sp"), [(4, 2, 3), (6, 4, 3)])
def test_heads_that_cannot_be_split_are_refused(heads: int, kv_heads: int, sp: int) -> None:
    config = Qwen2Config(num_attention_heads=heads, num_key_value_heads=kv_heads, hidden_size=heads * 8)
    with pytest.raises(UserError, match="sequence_parallel_size"):
        ulysses.check_heads(config, sp)
