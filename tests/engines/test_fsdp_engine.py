"""FSDPPolicyEngine: 2 gloo ranks train exactly like 1 (as data-parallel ranks, or as one Ulysses sequence-parallel
group), micro-batching is exact, log-probs match a plain forward, checkpoints are HF-loadable and independent of the
world size."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gloo_ranks import spawn_ranks
from or1.algos.losses import LossConfig, token_log_probs
from or1.algos.rollout_correction import CorrectionSettings, correct
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.loading import load_causal_lm
from or1.engines.train_settings import TrainSettings
from or1.hybrid.batch import Batch
from or1.workers.rollout_rows import pack_sequences

PROMPT_W, RESPONSE_W = 12, 16


def make_batch(rows: int, seed: int = 0) -> Batch:
    """Random prompts / responses of varied lengths with advantages of both signs (and one masked-out row)."""
    g = torch.Generator().manual_seed(seed)
    prompts = [
        torch.randint(3, 200, (int(torch.randint(3, PROMPT_W + 1, (1,), generator=g)),), generator=g).tolist()
        for _ in range(rows)
    ]
    responses = [
        torch.randint(
            3, 200, (int(torch.randint(1, RESPONSE_W + 1, (1,), generator=g)),), generator=g
        ).tolist()
        for _ in range(rows)
    ]
    t = pack_sequences(prompts, responses, PROMPT_W, RESPONSE_W, pad_id=0)
    t["response_mask"][1] = 0  # a masked (e.g. truncated) response still goes through the forward pass
    mask = t["response_mask"].float()
    t["old_log_probs"] = (-torch.rand(rows, RESPONSE_W, generator=g) * 3 - 2) * mask
    t["advantages"] = torch.randn(rows, 1, generator=g) * mask
    return Batch(t)


def _rank(
    rank: int, world: int, init_file: str, model_dir: str, settings: list[TrainSettings], out_file: str
) -> None:
    """One rank: for each settings, a fresh engine does log-probs and one train step on its share of the batch."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = []
    for s in settings:
        engine = FSDPPolicyEngine(model_dir, s)
        batch = make_batch(8).chunk(world)[rank]
        lp = engine.log_probs(batch, temperature=1.0, with_entropy=True)
        metrics = engine.train_step(
            batch, LossConfig(clip_low=0.2, clip_high=0.28), temperature=1.0, entropy_coef=0.01
        )
        params = {name: t.clone() for name, t in engine.named_full_params()}
        state = engine.full_state_dict()  # rank 0 only: what a checkpoint holds
        if rank == 0:  # the weights pushed to the rollout are the checkpoint's, name for name
            assert params.keys() == state.keys()
            assert all(torch.equal(params[k], state[k]) for k in state)
        gathered = [None] * world
        dist.all_gather_object(
            gathered, {"log_probs": lp.tensors["log_probs"], "entropy": lp.tensors["entropy"]}
        )
        results.append(
            {
                "metrics": metrics,
                "params": params,
                "log_probs": torch.cat([g["log_probs"] for g in gathered]),
                "entropy": torch.cat([g["entropy"] for g in gathered]),
            }
        )
    if rank == 0:
        torch.save(results, out_file)


def run_ranks(tmp_path: Path, model_dir: Path, world: int, settings: list[TrainSettings]) -> list[dict]:
    out, init = tmp_path / f"out_{world}.pt", tmp_path / f"pg_{world}"
    spawn_ranks(_rank, world, str(init), str(model_dir), settings, str(out), nprocs=world)
    return torch.load(out, weights_only=False)


LR = 1e-3
# Adam's first step moves each weight by ~lr * sign(grad): for near-zero gradients float rounding decides the
# sign, so parameters are compared to a small fraction of lr, and the gradients themselves via grad_norm / loss.
PARAM_ATOL = 0.05 * LR


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[dict]:
    settings = [TrainSettings(lr=LR, micro_batch_size=m) for m in (4, 8, 3)]  # 3: micro-batches of 3 + 3 + 2
    return run_ranks(tmp_path_factory.mktemp("one_rank"), model_dir, 1, settings)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[dict]:
    return run_ranks(
        tmp_path_factory.mktemp("two_ranks"), model_dir, 2, [TrainSettings(lr=LR, micro_batch_size=2)]
    )


@pytest.fixture(scope="module")
def two_sp_ranks(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[dict]:
    """One Ulysses group of 2 ranks (dp = 1): each rank is handed half the batch, as DP_COMPUTE would."""
    settings = [
        TrainSettings(
            lr=LR, micro_batch_size=3, sequence_parallel_size=2, gradient_checkpointing=checkpointing
        )
        for checkpointing in (False, True)  # True: backward re-runs the attention with its all-to-alls
    ]
    # micro-batches by a per-rank token budget: each holds up to 2 x 40 tokens of the group
    settings.append(TrainSettings(lr=LR, max_tokens_per_micro_batch=40, sequence_parallel_size=2))
    return run_ranks(tmp_path_factory.mktemp("two_sp_ranks"), model_dir, 2, settings)


def assert_same_step(a: dict, b: dict) -> None:
    for key in ("pg_loss", "entropy_loss", "grad_norm", "clip_frac", "entropy"):
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-4, abs=1e-6), key
    for name, value in b["params"].items():
        torch.testing.assert_close(a["params"][name], value, atol=PARAM_ATOL, rtol=0)


def test_two_ranks_equal_one_rank(one_rank: list[dict], two_ranks: list[dict], model_dir: Path) -> None:
    one, two = one_rank[0], two_ranks[0]
    torch.testing.assert_close(two["log_probs"], one["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(two["entropy"], one["entropy"], atol=1e-5, rtol=1e-5)
    assert_same_step(two, one)
    start = load_causal_lm(model_dir).state_dict()
    moved = sum(float((one["params"][n] - start[n]).abs().max()) > 10 * PARAM_ATOL for n in one["params"])
    assert moved == len(one["params"])  # the step really moved every tensor (the comparison is not vacuous)


def test_sequence_parallel_equals_one_rank(one_rank: list[dict], two_sp_ranks: list[dict]) -> None:
    """SP=2 (packed micro-batches of 3 + 3 + 2 rows, or by token budget, split token-wise over 2 ranks) vs 1 rank
    with padded micro-batches of 4."""
    one = one_rank[0]
    for sp in two_sp_ranks:  # without and with activation checkpointing, by token budget
        torch.testing.assert_close(sp["log_probs"], one["log_probs"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(sp["entropy"], one["entropy"], atol=1e-5, rtol=1e-5)
        assert_same_step(sp, one)


def test_micro_batching_equals_full_batch(one_rank: list[dict]) -> None:
    full, micro = one_rank[1], one_rank[2]
    assert micro["metrics"]["pg_loss"] == pytest.approx(full["metrics"]["pg_loss"], rel=1e-5)
    assert_same_step(micro, full)


def test_log_probs_match_an_unpadded_forward(one_rank: list[dict], model_dir: Path) -> None:
    result = one_rank[0]
    model = load_causal_lm(model_dir)
    batch = make_batch(8)
    for i in range(8):  # each row alone, no padding at all: the engine's trimmed, padded passes must agree
        mask = batch.tensors["attention_mask"][i].bool()
        ids = batch.tensors["input_ids"][i][mask][None]
        n_resp = int(batch.tensors["attention_mask"][i, PROMPT_W:].sum())
        logits = model(input_ids=ids).logits[:, -n_resp - 1 : -1]
        expected = token_log_probs(logits, ids[:, -n_resp:])[0]
        torch.testing.assert_close(result["log_probs"][i, :n_resp], expected, atol=1e-4, rtol=1e-4)
        assert torch.all(result["log_probs"][i, n_resp:] == 0)


def _save_rank(rank: int, world: int, init_file: str, model_dir: str, folder: str, load_from: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    engine = FSDPPolicyEngine(model_dir, TrainSettings(lr=1e-3, micro_batch_size=4))
    if load_from:
        engine.load(Path(load_from))
    else:
        engine.train_step(make_batch(8).chunk(world)[rank], LossConfig(), temperature=1.0)
    engine.save(Path(folder))


def test_checkpoint_is_hf_loadable_and_world_size_independent(tmp_path: Path, model_dir: Path) -> None:
    saved, resaved = tmp_path / "two_ranks", tmp_path / "one_rank"
    spawn_ranks(_save_rank, 2, str(tmp_path / "pg_a"), str(model_dir), str(saved), "")
    model = load_causal_lm(saved)  # plain transformers loading, no or1 code in between
    assert json.loads((saved / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    assert not torch.equal(
        model.state_dict()["model.norm.weight"], load_causal_lm(model_dir).state_dict()["model.norm.weight"]
    )
    spawn_ranks(_save_rank, 1, str(tmp_path / "pg_b"), str(model_dir), str(resaved), str(saved), nprocs=1)
    again = load_causal_lm(resaved).state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(again[name], value, atol=0, rtol=0)
    opt_two = torch.load(saved / "optimizer.pt", weights_only=False)["optimizer"]["state"]
    opt_one = torch.load(resaved / "optimizer.pt", weights_only=False)["optimizer"]["state"]
    for name, state in opt_two.items():
        torch.testing.assert_close(opt_one[name]["exp_avg_sq"], state["exp_avg_sq"], atol=0, rtol=0)


def _first_step_rank(_rank: int, init_file: str, model_dir: str, folder: str, out_file: str) -> None:
    """Three engines take their first step: one straight, one after saving a checkpoint, one loaded from that."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    torch.set_num_threads(1)
    batch, settings = make_batch(8), TrainSettings(lr=LR, micro_batch_size=8)
    params = {}
    for kind in ("straight", "saved", "loaded"):
        engine = FSDPPolicyEngine(model_dir, settings)
        if kind == "saved":
            engine.save(Path(folder))
        elif kind == "loaded":
            engine.load(Path(folder))
        engine.train_step(batch, LossConfig(), temperature=1.0)
        params[kind] = {name: t.clone() for name, t in engine.named_full_params()}
    torch.save(params, out_file)


def test_a_checkpoint_before_the_first_step_leaves_that_step_alone(tmp_path: Path, model_dir: Path) -> None:
    """Saving (or resuming from) a checkpoint whose optimizer never stepped must not start Adam's state early:
    a stage stopped before its first update then resumed ends with the same weights as one never stopped."""
    out = tmp_path / "params.pt"
    spawn_ranks(
        _first_step_rank, str(tmp_path / "pg"), str(model_dir), str(tmp_path / "ckpt"), str(out), nprocs=1
    )
    params = torch.load(out, weights_only=False)
    for name, value in params["straight"].items():
        torch.testing.assert_close(params["saved"][name], value, atol=0, rtol=0)
        torch.testing.assert_close(params["loaded"][name], value, atol=0, rtol=0)


def _on_policy_rank(rank: int, world: int, init_file: str, model_dir: str, out_file: str) -> None:
    """Per sequence-parallel size: `_keeps_old_log_probs`, then `_weighs_like_a_separate_pass`, in the same two rank
    processes."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for sp in (1, 2):
        settings = TrainSettings(lr=LR, micro_batch_size=3, sequence_parallel_size=sp)
        batch = make_batch(8).chunk(world)[rank]
        results[sp] = (_keeps_old_log_probs(model_dir, settings, batch), _weighs(model_dir, settings, batch))
    torch.save(results, Path(out_file).with_suffix(f".rank{rank}.pt"))


def _keeps_old_log_probs(model_dir: str, settings: TrainSettings, batch: Batch) -> tuple:
    engine = FSDPPolicyEngine(model_dir, settings)
    before = engine.log_probs(batch, temperature=1.0).tensors["log_probs"]
    engine.train_step(batch.drop(["old_log_probs"]), LossConfig(), temperature=1.0)
    return before, engine.on_policy_log_probs


def _weighs(model_dir: str, settings: TrainSettings, batch: Batch) -> dict:
    """The same step twice from the same weights: importance weights from a separate log-prob pass, and from the
    on-policy update's own forward."""
    g = torch.Generator().manual_seed(1)
    results = {}
    for level in ("token", "sequence"):
        correction = CorrectionSettings(is_level=level, is_cap=1.5)
        loss = LossConfig(correction=correction)
        separate = FSDPPolicyEngine(model_dir, settings)
        old = separate.log_probs(batch, temperature=1.0).tensors["log_probs"]
        mask = batch.tensors["response_mask"]
        # a sampler that disagrees with the actor by up to ~0.3 nats a token: weights on both sides of the cap
        rollout = (old + 0.3 * torch.randn(old.shape, generator=g)) * mask
        weights = correct(old, rollout, mask, correction)[0]
        given = batch.drop(["old_log_probs"]).union(
            Batch({"old_log_probs": old, "rollout_is_weights": weights})
        )
        metrics = {"separate": separate.train_step(given, loss, temperature=1.0)}
        fused = FSDPPolicyEngine(model_dir, settings)
        own = batch.drop(["old_log_probs"]).union(Batch({"rollout_log_probs": rollout}))
        metrics["fused"] = fused.train_step(own, loss, temperature=1.0)
        params = {
            name: {n: t.clone() for n, t in engine.named_full_params()}
            for name, engine in (("separate", separate), ("fused", fused))
        }
        results[level] = (metrics, params, float((weights == 1.5).float().sum()), float((weights < 1).sum()))
    return results


@pytest.fixture(scope="module")
def on_policy_updates(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> list[dict]:
    """Each rank's on-policy update results per sequence-parallel size (1: 2 data-parallel ranks, 2: one group)."""
    tmp = tmp_path_factory.mktemp("on_policy")
    spawn_ranks(_on_policy_rank, 2, str(tmp / "pg"), str(model_dir), str(tmp / "out.pt"))
    return [torch.load(tmp / f"out.rank{rank}.pt", weights_only=False) for rank in range(2)]


@pytest.mark.parametrize("sp", [1, 2])
def test_an_on_policy_update_keeps_the_old_log_probs_of_its_own_rows(on_policy_updates: list[dict], sp: int):
    """What the sampler-mismatch metrics read after a fused update: each rank's rows, as a log-prob pass gives them
    (2 data-parallel ranks, or one sequence-parallel group pooling both shares)."""
    for rank in range(2):
        before, kept = on_policy_updates[rank][sp][0]
        assert kept.shape == before.shape == (4, RESPONSE_W)
        torch.testing.assert_close(kept, before, atol=1e-5, rtol=0)


@pytest.mark.parametrize("sp", [1, 2])
def test_an_on_policy_update_weighs_tokens_like_a_separate_pass(on_policy_updates: list[dict], sp: int):
    """Truncated importance sampling without the old-log-prob pass: the fused update's weights, computed from its
    own forward, train exactly like the controller's from a separate pass (token and sequence level; 2 ranks, data
    or sequence parallel)."""
    for level, (metrics, params, capped, below) in on_policy_updates[0][sp][1].items():
        assert capped > 0 and below > 0, level  # the cap and the ratio both shaped the loss
        assert metrics["fused"]["pg_loss"] == pytest.approx(
            metrics["separate"]["pg_loss"], rel=1e-5, abs=1e-7
        )
        for name, value in params["separate"].items():
            torch.testing.assert_close(params["fused"][name], value, atol=1e-6, rtol=0)
