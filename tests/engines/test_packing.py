"""Padding removal: a packed row (position ids restarting per sequence, the sequences' boundaries) gives each sequence
the outputs it gets alone, under or1's packed attention and transformers' sdpa and eager masks; packed passes and
token-budget micro-batches (2 gloo ranks) give the padded passes' log-probs, entropy, losses, gradients and critic
values; an on-policy update without old log-probs equals the two-pass update."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_critic_engine import with_targets
from test_fsdp_engine import PROMPT_W, RESPONSE_W, make_batch

from gloo_ranks import spawn_ranks
from or1.algos.losses import LossConfig
from or1.engines import varlen
from or1.engines.fsdp_actor import FSDPPolicyEngine
from or1.engines.fsdp_critic import FSDPCriticEngine
from or1.engines.loading import load_causal_lm
from or1.engines.packing import packed_window, padded_window, token_budget_slices
from or1.engines.train_settings import TrainSettings
from or1.engines.varlen import Segments
from or1.hybrid.batch import Batch


@pytest.mark.parametrize("attention", ["or1_varlen", "sdpa", "eager"])
def test_packed_sequences_attend_only_to_themselves(model_dir: Path, attention: str) -> None:
    """One packed row gives each sequence the outputs it gets alone: through the segments (or1's), and through the
    mask transformers builds from the position ids (sdpa, eager)."""
    model = load_causal_lm(model_dir)
    if attention == varlen.ATTENTION:
        varlen.enable(model)
    else:
        model.set_attn_implementation(attention)
    model.eval()
    micro = make_batch(12).tensors
    window = packed_window(micro)
    lengths = micro["attention_mask"].sum(-1)
    ids = window.inputs["input_ids"]
    assert ids.shape == (1, int(lengths.sum())) and window.segments.lengths == tuple(lengths.tolist())
    with torch.no_grad():
        # without use_cache=False a cache is made and transformers no longer reads sequences from position ids
        packed = window.picked(model(**window.inputs, use_cache=False).logits)[0]
        # the row read as one long sequence: later sequences then see earlier ones
        one_sequence = {
            "position_ids": torch.arange(ids.shape[1])[None],
            "segments": Segments((ids.shape[1],)),
        }
        leaky = window.picked(model(input_ids=ids, use_cache=False, **one_sequence).logits)[0]
    start = 0
    for i in range(12):  # each row alone, no padding: the reference, at the positions before its responses
        mask = micro["attention_mask"][i].bool()
        responses = int(window.real[i].sum())
        with torch.no_grad():
            alone = model(
                input_ids=micro["input_ids"][i][mask][None], segments=Segments((int(mask.sum()),))
            ).logits[0, -responses - 1 : -1]
        end = start + responses
        torch.testing.assert_close(packed[start:end], alone, atol=1e-5, rtol=1e-5)
        start = end
    assert not torch.allclose(leaky, packed, atol=1e-3)


def test_packed_and_padded_windows_score_the_same_response_tokens(model_dir: Path) -> None:
    model = load_causal_lm(model_dir).eval()
    micro = make_batch(6).tensors
    responses = micro["responses"]
    with torch.no_grad():
        outputs = {}
        for name, make in (("packed", packed_window), ("padded", padded_window)):
            window = make(micro)
            logits = window.kept(
                model(**window.inputs, use_cache=False, logits_to_keep=window.logits_to_keep).logits
            )
            # the logit of each target token, back in the [b, R] layout
            outputs[name] = window.scatter(logits.gather(-1, window.targets[..., None])[..., 0])
            all_positions = model(
                **window.inputs, use_cache=False
            ).logits  # `picked` reads the same positions from all outputs
            torch.testing.assert_close(window.picked(all_positions), logits)
    real = micro["attention_mask"][:, PROMPT_W:].bool()
    assert torch.all(outputs["packed"][~real] == 0)
    assert torch.all(outputs["packed"][real] != 0)
    torch.testing.assert_close(outputs["packed"], outputs["padded"], atol=1e-5, rtol=1e-5)
    assert torch.equal(
        responses, make_batch(6).tensors["responses"]
    )  # the windows do not write into the batch


def test_token_budget_slices() -> None:
    # consecutive rows while their sum fits; a row over the budget alone
    assert token_budget_slices([3, 4, 2, 9, 1, 1], budget=7) == [
        slice(0, 2),
        slice(2, 3),
        slice(3, 4),
        slice(4, 6),
    ]
    assert token_budget_slices([5, 5], budget=10) == [slice(0, 2)]
    assert token_budget_slices([], budget=4) == []


LR = 1e-3
# (name, settings, loss aggregation, fused): fused drops old_log_probs, so the update takes its own, detached
VARIANTS = [
    ("padded", TrainSettings(lr=LR, micro_batch_size=3), "token-mean", False),
    ("packed", TrainSettings(lr=LR, micro_batch_size=3, remove_padding=True), "token-mean", False),
    ("budget", TrainSettings(lr=LR, max_tokens_per_micro_batch=40, remove_padding=True), "token-mean", False),
    ("fused", TrainSettings(lr=LR, micro_batch_size=3, remove_padding=True), "token-mean", True),
    ("padded_seq", TrainSettings(lr=LR, micro_batch_size=3), "seq-mean-token-sum-norm", False),
    (
        "budget_seq",
        TrainSettings(lr=LR, max_tokens_per_micro_batch=40, remove_padding=True),
        "seq-mean-token-sum-norm",
        False,
    ),
]


def _gather(tensor: torch.Tensor, world: int) -> torch.Tensor:
    parts = [None] * world
    dist.all_gather_object(parts, tensor)
    return torch.cat(parts)


def _policy_rank(rank: int, world: int, init_file: str, model_dir: str, out_file: str) -> None:
    """Each variant: a fresh engine computes log-probs, then takes one step (its gradients recorded) on its share."""
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for name, settings, agg_mode, fused in VARIANTS:
        engine = FSDPPolicyEngine(model_dir, settings)
        batch = make_batch(8).chunk(world)[rank]
        out = engine.log_probs(batch, temperature=1.0, with_entropy=True)
        # the two-pass path: the old log-probs come from the separate pass with the same weights
        batch = batch.drop(["old_log_probs"])
        if not fused:
            batch = batch.union(Batch({"old_log_probs": out.tensors["log_probs"]}))
        grads: dict[str, torch.Tensor] = {}
        step = engine._optimizer_step

        def record(engine: FSDPPolicyEngine = engine, grads: dict = grads, step=step) -> float:
            grads.update({n: p.grad.full_tensor().clone() for n, p in engine.model.named_parameters()})
            return step()

        engine._optimizer_step = record
        loss_cfg = LossConfig(clip_low=0.2, clip_high=0.28, agg_mode=agg_mode, norm_length=RESPONSE_W)
        metrics = engine.train_step(batch, loss_cfg, temperature=1.0, entropy_coef=0.01)
        results[name] = {
            "metrics": metrics,
            "grads": grads,
            "log_probs": _gather(out.tensors["log_probs"], world),
            "entropy": _gather(out.tensors["entropy"], world),
        }
    if rank == 0:
        torch.save(results, out_file)


@pytest.fixture(scope="module")
def policy_runs(tmp_path_factory: pytest.TempPathFactory, model_dir: Path) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("packing")
    args = (2, str(tmp / "pg"), str(model_dir), str(tmp / "out.pt"))
    spawn_ranks(_policy_rank, *args)
    return torch.load(tmp / "out.pt", weights_only=False)


def assert_same_update(a: dict, b: dict, keys: tuple[str, ...]) -> None:
    for key in keys:
        assert a["metrics"][key] == pytest.approx(b["metrics"][key], rel=1e-4, abs=1e-6), key
    for name, grad in b["grads"].items():
        torch.testing.assert_close(a["grads"][name], grad, atol=1e-6, rtol=1e-4)


STEP_KEYS = ("pg_loss", "entropy_loss", "entropy", "grad_norm", "clip_frac", "approx_kl", "sampled_entropy")


@pytest.mark.parametrize(
    "packed, padded", [("packed", "padded"), ("budget", "padded"), ("budget_seq", "padded_seq")]
)
def test_packed_passes_equal_padded_ones(policy_runs: dict[str, dict], packed: str, padded: str) -> None:
    a, b = policy_runs[packed], policy_runs[padded]
    torch.testing.assert_close(a["log_probs"], b["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a["entropy"], b["entropy"], atol=1e-5, rtol=1e-5)
    assert_same_update(a, b, STEP_KEYS)
    assert b["metrics"]["grad_norm"] > 0 and b["metrics"]["pg_loss"] != 0


def test_seq_mean_losses_differ_from_token_mean(policy_runs: dict[str, dict]) -> None:
    """The aggregation really changed between the two families compared above (the comparison is not vacuous)."""
    token, seq = policy_runs["padded"]["metrics"], policy_runs["padded_seq"]["metrics"]
    assert token["pg_loss"] != pytest.approx(seq["pg_loss"], rel=1e-2)


def test_on_policy_update_equals_the_two_pass_update(policy_runs: dict[str, dict]) -> None:
    fused, two_pass = policy_runs["fused"], policy_runs["packed"]
    assert_same_update(fused, two_pass, (*STEP_KEYS, "clip_frac_low", "clip_frac_high", "ratio_mean"))
    assert fused["metrics"]["ratio_mean"] == 1.0  # the detached own log-probs: exactly on-policy
    batch = make_batch(8).tensors
    mask = batch["response_mask"].float()
    # what the loop took from the separate pass: e_k from the old log-probs, the entropy metric from its entropy
    e_k = float(-(two_pass["log_probs"] * mask).sum() / mask.sum())
    assert fused["metrics"]["sampled_entropy"] == pytest.approx(e_k, rel=1e-5)
    entropy = float((two_pass["entropy"] * mask).sum() / mask.sum())
    assert fused["metrics"]["entropy"] == pytest.approx(entropy, rel=1e-5)


def test_an_off_policy_update_needs_old_log_probs(tmp_path: Path, model_dir: Path) -> None:
    with pytest.raises(Exception, match="one mini-batch and one epoch"):
        spawn_ranks(_off_policy_rank, str(tmp_path / "pg"), str(model_dir), nprocs=1)


def _off_policy_rank(_rank: int, init_file: str, model_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=0, world_size=1)
    try:
        engine = FSDPPolicyEngine(model_dir, TrainSettings(mini_batches=2))
        engine.train_step(make_batch(4).drop(["old_log_probs"]), LossConfig(), temperature=1.0)
    finally:
        dist.destroy_process_group()


def _critic_rank(rank: int, world: int, init_file: str, model_dir: str, out_file: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.set_num_threads(1)
    results = {}
    for name, settings in (
        ("padded", TrainSettings(lr=LR, micro_batch_size=3)),
        ("packed", TrainSettings(lr=LR, max_tokens_per_micro_batch=40, remove_padding=True)),
    ):
        torch.manual_seed(0)  # the new value head: the same draw on every rank and variant
        engine = FSDPCriticEngine(model_dir, settings, cliprange_value=10.0)
        batch = with_targets(make_batch(8)).chunk(world)[rank]
        values = engine.values(batch).tensors["values"]
        first = engine.train_step(batch)
        second = engine.train_step(batch)  # after a step of Adam: the updates moved the same way
        results[name] = {"values": _gather(values, world), "metrics": [first, second]}
    if rank == 0:
        torch.save(results, out_file)


def test_packed_critic_equals_padded(tmp_path: Path, model_dir: Path) -> None:
    spawn_ranks(_critic_rank, 2, str(tmp_path / "pg"), str(model_dir), str(tmp_path / "out.pt"))
    runs = torch.load(tmp_path / "out.pt", weights_only=False)
    torch.testing.assert_close(runs["packed"]["values"], runs["padded"]["values"], atol=1e-5, rtol=1e-5)
    assert runs["padded"]["values"].abs().sum() > 0
    for packed, padded in zip(runs["packed"]["metrics"], runs["padded"]["metrics"], strict=True):
        for key in ("vf_loss", "grad_norm", "value_mean", "vf_clip_frac"):
            assert packed[key] == pytest.approx(padded[key], rel=1e-4, abs=1e-6), key
