"""FSDPCriticEngine: values line up with the policy's log-prob positions, 2 gloo ranks update like 1 (data- or
sequence-parallel), the value head
learns its targets, and a saved critic is a plain HF token-classification folder that loads back exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_fsdp_engine import PROMPT_W, make_batch

from gloo_ranks import spawn_ranks
from or1.engines.fsdp_critic import FSDPCriticEngine
from or1.engines.loading import load_value_model
from or1.engines.train_settings import TrainSettings
from or1.hybrid.batch import Batch

STEPS = 8  # value updates towards fixed returns


def with_targets(batch: Batch) -> Batch:
    """Old values 0 and returns that differ by token and row (what GAE's returns look like: any real number)."""
    mask = batch.tensors["response_mask"].float()
    rows, width = mask.shape
    returns = (torch.arange(rows * width, dtype=torch.float32).reshape(rows, width) % 5 - 2) / 4 * mask
    return batch.union(Batch({"values": torch.zeros_like(mask), "returns": returns}))


def _rank(
    rank: int, world: int, init_file: str, model_dir: str, out_file: str, save_to: str, sp: int
) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the new value head: the same draw on every rank
    engine = FSDPCriticEngine(
        model_dir, TrainSettings(lr=1e-3, micro_batch_size=3, sequence_parallel_size=sp), cliprange_value=10.0
    )
    batch = with_targets(make_batch(8)).chunk(world)[rank]
    values = engine.values(batch).tensors["values"]
    history = [engine.train_step(batch) for _ in range(STEPS)]
    gathered = [None] * world
    dist.all_gather_object(gathered, values)
    if save_to:
        engine.save(Path(save_to))
    if rank == 0:
        torch.save({"values": torch.cat(gathered), "history": history}, out_file)


def run_ranks(tmp_path: Path, model_dir: Path, world: int, save_to: str = "", sp: int = 1) -> dict:
    """`world` ranks, each handed its share of the batch; sp > 1: groups of `sp` ranks in Ulysses parallel."""
    out = tmp_path / f"critic_{world}_{sp}.pt"
    args = (world, str(tmp_path / f"pg_{world}_{sp}"), str(model_dir), str(out), save_to, sp)
    spawn_ranks(_rank, *args, nprocs=world)
    return torch.load(out, weights_only=False)


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict:
    tmp = tmp_path_factory.mktemp("critic_one")
    result = run_ranks(tmp, model_dir, 1, save_to=str(tmp / "saved"))
    result["saved"] = tmp / "saved"
    return result


def test_values_read_the_state_before_each_response_token(one_rank: dict, model_dir: Path) -> None:
    torch.manual_seed(0)
    model = load_value_model(model_dir)  # the same head draw as the engine's
    batch = make_batch(8)
    for i in range(
        8
    ):  # each row alone, unpadded: V_t is the head's output at the position that predicts token t
        mask = batch.tensors["attention_mask"][i].bool()
        ids = batch.tensors["input_ids"][i][mask][None]
        n_resp = int(batch.tensors["attention_mask"][i, PROMPT_W:].sum())
        expected = model(input_ids=ids).logits[0, -n_resp - 1 : -1, 0]
        torch.testing.assert_close(one_rank["values"][i, :n_resp], expected, atol=1e-4, rtol=1e-4)
        assert torch.all(one_rank["values"][i, n_resp:] == 0)


def test_value_loss_falls_and_two_ranks_equal_one(one_rank: dict, tmp_path: Path, model_dir: Path) -> None:
    losses = [m["vf_loss"] for m in one_rank["history"]]
    # the head regresses onto the returns: last / first read 0.046-0.075 over AVX-512 / avx2 x OR1_TEST_SEED 0..2
    assert losses[-1] < 0.5 * losses[0], losses
    two = run_ranks(tmp_path, model_dir, 2)
    torch.testing.assert_close(two["values"], one_rank["values"], atol=1e-5, rtol=1e-5)
    for a, b in zip(two["history"], one_rank["history"], strict=True):
        assert a["vf_loss"] == pytest.approx(b["vf_loss"], rel=1e-3)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def test_sequence_parallel_critic_equals_one_rank(one_rank: dict, tmp_path: Path, model_dir: Path) -> None:
    """One Ulysses group of 2 ranks: the same values and the same 8 value updates as one rank."""
    sp = run_ranks(tmp_path, model_dir, 2, sp=2)
    torch.testing.assert_close(sp["values"], one_rank["values"], atol=1e-5, rtol=1e-5)
    for a, b in zip(sp["history"], one_rank["history"], strict=True):
        assert a["vf_loss"] == pytest.approx(b["vf_loss"], rel=1e-3)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-3)


def _reload_rank(rank: int, init_file: str, folder: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    engine = FSDPCriticEngine(folder, TrainSettings(), cliprange_value=0.5)
    engine.load(Path(folder))  # the optimizer state written beside the weights loads too
    torch.save(engine.values(with_targets(make_batch(8))).tensors["values"], out_file)


def test_saved_critic_is_an_hf_folder_that_reloads(one_rank: dict, tmp_path: Path) -> None:
    saved = one_rank["saved"]
    config = json.loads((saved / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"] and len(config["id2label"]) == 1
    assert (saved / "optimizer.pt").is_file()
    out = tmp_path / "values.pt"
    spawn_ranks(_reload_rank, str(tmp_path / "pg"), str(saved), str(out), nprocs=1)
    trained = load_value_model(saved)  # plain transformers loading of the trained critic
    batch = make_batch(8)
    mask = batch.tensors["attention_mask"][0].bool()
    n_resp = int(batch.tensors["attention_mask"][0, PROMPT_W:].sum())
    expected = trained(input_ids=batch.tensors["input_ids"][0][mask][None]).logits[0, -n_resp - 1 : -1, 0]
    values = torch.load(out)
    torch.testing.assert_close(values[0, :n_resp], expected, atol=1e-4, rtol=1e-4)
    assert not torch.allclose(values, one_rank["values"])  # the trained head, not the initial draw
