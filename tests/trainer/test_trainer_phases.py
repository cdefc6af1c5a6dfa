"""Controller phases on hand-made batches: truncation policy, rejection sampling, GRPO advantages, metrics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from or1.algos.entropy_control import AdaptiveEntropyController
from or1.config.recipe import resolve
from or1.config.schema import AlgorithmConfig, EntropyControlConfig
from or1.hybrid.batch import Batch
from or1.trainer.loop import train_step
from or1.trainer.phases import (
    ability_metrics,
    add_advantages,
    balance_ranks,
    fuses_old_log_prob,
    rejection_sample,
    rollout_correction,
    rollout_entropy,
    rollout_metrics,
    sampled_entropy,
    sampler_mismatch,
    truncation_policy,
)
from or1.trainer.step_log import PhaseTimer


def scored_batch(scores: list[float], truncated: list[bool], groups: list[str], width: int = 4) -> Batch:
    n = len(scores)
    lengths = torch.tensor([2 + i % 3 for i in range(n)])
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    return Batch(
        {
            "scores": torch.tensor(scores, dtype=torch.float32),
            "truncated": torch.tensor(truncated),
            "response_mask": mask,
            "response_length": lengths,
            "old_log_probs": -0.5 * mask.float(),
        },
        {"uid": groups},
    )


def test_zero_reward_truncation_and_rejection_keep_only_informative_groups() -> None:
    # group a: 1, 1(truncated -> 0)  -> informative; group b: 1, 1 -> all solved; group c: 0, 0 -> none solved
    batch = scored_batch(
        [1, 1, 1, 1, 0, 0], [False, True, False, False, False, False], ["a", "a", "b", "b", "c", "c"]
    )
    batch = truncation_policy(batch, AlgorithmConfig())
    assert batch.tensors["rewards"].tolist() == [1, 0, 1, 1, 0, 0]
    kept, stats = rejection_sample(batch, AlgorithmConfig(), multiple=2)
    assert list(kept.non_tensor["uid"]) == ["a", "a"]
    assert stats.solve_all_frac == pytest.approx(1 / 3) and stats.solve_none_frac == pytest.approx(1 / 3)
    metrics = rollout_metrics(batch, stats)
    assert metrics["batch/rejected_frac"] == pytest.approx(4 / 6)
    assert metrics["response/truncated_frac"] == pytest.approx(1 / 6)
    assert metrics["reward/mean"] == pytest.approx(3 / 6)


def test_mask_truncation_keeps_reward_but_drops_tokens() -> None:
    batch = scored_batch([1, 0], [True, False], ["a", "a"])
    out = truncation_policy(batch, AlgorithmConfig(truncated="mask"))
    assert out.tensors["rewards"].tolist() == [1, 0]
    assert out.tensors["response_mask"][0].sum() == 0 and out.tensors["response_mask"][1].sum() == 3


def test_rejection_trims_to_the_data_parallel_multiple() -> None:
    batch = truncation_policy(scored_batch([1, 0, 0] * 3, [False] * 9, list("aaabbbccc")), AlgorithmConfig())
    kept, stats = rejection_sample(batch, AlgorithmConfig(), multiple=2)
    assert len(kept) % 2 == 0 and len(kept) == 8 and stats.trimmed == 1


def test_grpo_advantages_broadcast_over_response_tokens() -> None:
    batch = truncation_policy(scored_batch([1, 0, 0, 0], [False] * 4, ["a"] * 4), AlgorithmConfig())
    out = add_advantages(batch, AlgorithmConfig())
    # rewards 1,0,0,0: mean 0.25, sample std 0.5 -> advantages 1.5, -0.5, -0.5, -0.5 on every real token
    mask = batch.tensors["response_mask"].float()
    expected = torch.tensor([1.5, -0.5, -0.5, -0.5])[:, None] * mask
    torch.testing.assert_close(out.tensors["advantages"], expected, atol=1e-5, rtol=1e-5)
    assert sampled_entropy(out) == pytest.approx(0.5)


def test_mask_truncation_keeps_the_truncated_score_in_the_group_statistics() -> None:
    # Adv-Mask-After (Skywork-OR1 paper, section on truncated responses): one group, scores 1, 1 (truncated), 0, 0.
    # The truncated score still enters the statistics: mean 0.5, sample std sqrt(1/3) = 0.57735, so
    # A = +-0.5 / (0.57735 + 1e-6) = +-0.866024 (verl's GRPO: torch.std and eps 1e-6); the truncated row then
    # gets no advantage because its tokens are out of the loss mask.
    batch = scored_batch([1, 1, 0, 0], [False, True, False, False], ["a"] * 4)
    out = add_advantages(truncation_policy(batch, AlgorithmConfig(truncated="mask")), AlgorithmConfig())
    a = 0.5 / ((1 / 3) ** 0.5 + 1e-6)
    mask = batch.tensors["response_mask"].float()
    mask[1] = 0.0
    expected = torch.tensor([a, a, -a, -a])[:, None] * mask
    torch.testing.assert_close(out.tensors["advantages"], expected, atol=1e-6, rtol=1e-6)
    # Were the truncated score counted as 0 (the bug), the group would be 1, 0, 0, 0: A = 1.5, -0.5, -0.5, -0.5.
    assert out.tensors["advantages"][0, 0].item() == pytest.approx(0.866024, abs=1e-5)


def test_the_old_log_prob_pass_is_fused_only_where_it_is_exact() -> None:
    paper = AdaptiveEntropyController.from_config(EntropyControlConfig())
    paper.step(0.1)  # a positive coefficient: paper timing's alpha now depends on e_k
    repository = AdaptiveEntropyController.from_config(EntropyControlConfig(timing="repository"))
    repository.step(0.1)

    def fuses(overrides: list[str], controller: AdaptiveEntropyController = repository) -> bool:
        return fuses_old_log_prob(resolve("tiny", 1, overrides), controller)

    assert fuses([])  # tiny: one mini-batch, one epoch, no KL
    assert not fuses(["actor.old_log_prob=recompute"])
    assert not fuses(["actor.ppo_mini_batch_size=8"])  # two optimizer steps per batch
    assert not fuses(["actor.ppo_epochs=2"])
    assert not fuses(["algorithm.kl.enabled=true", "algorithm.kl.in_reward=true"])
    assert fuses(
        ["algorithm.kl.enabled=true"]
    )  # a KL loss term reads the reference's log-probs, not old ones
    # paper timing: the switch reads the sampler's log-probs, only where they are the training distribution's
    assert fuses([], paper)
    assert not fuses(["rollout.top_p=0.9"], paper)
    assert fuses(["rollout.top_p=0.9"])  # repository timing: alpha_k does not depend on e_k
    assert not fuses(["rollout.engine=vllm", "rollout.temperature=0.8"], paper)
    assert fuses(["rollout.engine=vllm"], paper)
    # asynchronous: the sampler's log-probs are of weights up to k updates old, not of the weights that step trains
    sampled_ahead = [
        "rollout.placement=separate",
        "rollout.max_staleness=1",
        "algorithm.rollout_correction.is_level=token",
    ]
    assert not fuses(sampled_ahead, paper)
    assert fuses(sampled_ahead)
    # truncated importance weights pi_old / pi_sampler come from the update's own forward, row by row; rejection
    # changes the loss's token count, which the update needs before its first micro-batch
    assert fuses(["algorithm.rollout_correction.is_level=token"])
    assert fuses(["algorithm.rollout_correction.is_level=sequence"])
    assert not fuses(["algorithm.rollout_correction.rejection=geometric"])
    assert not fuses(
        ["algorithm.rollout_correction.is_level=token", "algorithm.rollout_correction.rejection=token"]
    )


def test_dapo_overlong_penalty_adds_to_the_truncation_policy() -> None:
    # width 4 is the budget; buffer 2: lengths 2, 3, 4 get 0, -0.5, -1 (x penalty 0.5); truncated scores 0 first
    batch = scored_batch([1, 1, 1], [False, False, True], ["a", "a", "a"])
    algorithm = AlgorithmConfig(overlong={"buffer": 2, "penalty": 0.5})
    assert truncation_policy(batch, algorithm).tensors["rewards"].tolist() == [1.0, 0.75, -0.5]


def test_mismatch_metrics_per_ability_and_the_correction_phase() -> None:
    batch = scored_batch([1, 0, 1, 0], [False] * 4, ["a", "a", "b", "b"])
    mask = batch.tensors["response_mask"].float()
    rollout = batch.tensors["old_log_probs"] - torch.tensor([[0.0], [0.0], [1.0], [0.1]]) * mask
    batch = batch.union(Batch({"rollout_log_probs": rollout}, {"ability": ["math", "math", "code", "code"]}))
    algorithm = AlgorithmConfig(rollout_correction={"is_level": "token", "is_cap": 2.0})
    m = sampler_mismatch(batch, algorithm, batch.tensors["response_mask"])
    assert m["mismatch/math/abs_diff_max"] == 0.0 and m["mismatch/code/abs_diff_max"] == pytest.approx(1.0)
    assert m["mismatch/code/past_threshold_frac"] == pytest.approx(4 / 6)  # row 2's 4 tokens of the 6 of code
    corrected, metrics = rollout_correction(batch, algorithm)
    weights = corrected.tensors["rollout_is_weights"]
    assert weights[2, 0] == 2.0 and weights[3, 0] == pytest.approx(torch.e**0.1) and weights[0, 0] == 1.0
    assert metrics["mismatch/is_truncated_frac"] > 0
    assert rollout_correction(batch, AlgorithmConfig())[0] is batch  # off: untouched


class RecordingActor:
    """The actor worker group as train_step calls it: fixed old log-probs, and the batch each update received."""

    world_size = 1

    def __init__(self, old_log_probs: torch.Tensor) -> None:
        self.old_log_probs = old_log_probs
        self.updated: list[Batch] = []

    def compute_log_prob(self, batch: Batch) -> Batch:
        return Batch({"old_log_probs": self.old_log_probs})

    def update_actor(self, batch: Batch, entropy_coef: float = 0.0) -> list[dict[str, float]]:
        self.updated.append(batch)
        return [{"pg_loss": 0.0}]


def test_train_step_measures_the_mismatch_before_rejection_and_trains_on_the_kept_tokens() -> None:
    # one group of two responses (3 and 2 tokens); log rho = log pi_old - log pi_sampler per loss token:
    # row 0: 0.5, -1.0, 0.0; row 1: 0.1, -2.0. Token rejection outside [1/2, 2] drops the -1.0 and the -2.0.
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    rollout = torch.tensor([[-1.5, -1.0, -0.5], [-0.2, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    batch = Batch(
        {
            "input_ids": torch.zeros(2, 5, dtype=torch.long),
            "attention_mask": torch.ones(2, 5, dtype=torch.long),
            "responses": torch.zeros(2, 3, dtype=torch.long),
            "response_mask": mask,
            "response_length": torch.tensor([3, 2]),
            "rollout_log_probs": rollout,
            "rewards": torch.tensor([1.0, 0.0]),
        },
        {"uid": ["g", "g"]},
    )
    overrides = [
        "algorithm.rollout_correction.is_level=token",
        "algorithm.rollout_correction.is_cap=1.5",
        "algorithm.rollout_correction.rejection=token",
        "algorithm.rollout_correction.rejection_upper=2.0",
        "trainer.balance_batch=false",
    ]
    cfg = resolve("tiny", 1, overrides)
    actor = RecordingActor(old)
    t = SimpleNamespace(
        cfg=cfg,
        actor=actor,
        critic=None,
        entropy=AdaptiveEntropyController.from_config(cfg.algorithm.entropy),
    )
    _, _, metrics = train_step(t, batch, PhaseTimer())
    # the gap over all 5 loss tokens, the two rejected ones too (after rejection: 0.2, 0.5 and 1/3)
    assert metrics["mismatch/abs_diff_mean"] == pytest.approx((0.5 + 1.0 + 0.0 + 0.1 + 2.0) / 5)
    assert metrics["mismatch/abs_diff_max"] == pytest.approx(2.0)
    # |log rho| > log 1.5 = 0.41: 0.5, 1.0 and 2.0
    assert metrics["mismatch/past_threshold_frac"] == pytest.approx(3 / 5)
    assert metrics["mismatch/rejected_token_frac"] == pytest.approx(2 / 5)
    assert metrics["mismatch/rejected_seq_frac"] == 1.0
    # the update trains on the kept tokens only, each weighted by min(rho, 1.5)
    (update,) = actor.updated
    assert update.tensors["response_mask"].tolist() == [[1, 0, 1], [1, 0, 0]]
    expected = torch.tensor([[1.5, 0.0, 1.0], [torch.e**0.1, 0.0, 0.0]])
    torch.testing.assert_close(update.tensors["rollout_is_weights"], expected)


def test_rollout_entropy_reads_the_samplers_log_probs() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    batch = Batch(
        {"rollout_log_probs": torch.tensor([[-0.1, -0.3, -9.0], [-0.2, -9.0, -9.0]]), "response_mask": mask}
    )
    assert rollout_entropy(batch) == pytest.approx((0.1 + 0.3 + 0.2) / 3)


def test_balance_ranks_gives_each_share_the_same_tokens() -> None:
    # in sampling order the first share holds 143 tokens, the second 41
    lengths = [40, 38, 35, 30, 12, 11, 10, 8]
    mask = (torch.arange(48)[None] < torch.tensor(lengths)[:, None]).long()
    batch = Batch({"attention_mask": mask, "row": torch.arange(8)}, {"uid": list("aabbccdd")})
    balanced = balance_ranks(batch, 2)
    shares = [share.tensors["attention_mask"].sum().item() for share in balanced.chunk(2)]
    assert shares == [90, 94]  # dealt longest first in snake order: 40 30 12 8 and 38 35 11 10
    rows = balanced.tensors["row"].tolist()
    # each share in sampling order: no length bias across mini-batches
    assert rows == [0, 3, 4, 7, 1, 2, 5, 6]
    assert sorted(rows) == list(range(8))  # the same rows, uids kept with them
    assert [balanced.non_tensor["uid"][i] for i in range(8)] == [
        "aabbccdd"[r] for r in balanced.tensors["row"].tolist()
    ]


def test_a_mixed_batch_reports_each_ability_apart() -> None:
    batch = truncation_policy(
        scored_batch([1, 0, 1, 1, 0, 0], [False] * 5 + [True], ["a", "a", "b", "b", "c", "c"]),
        AlgorithmConfig(),
    )
    batch = batch.union(
        Batch(
            non_tensor={
                "ability": ["math", "math", "code", "code", "code", "code"],
                "score_reason": ["correct", "wrong_answer", "correct", "correct", "timeout", "no_code"],
            }
        )
    )
    m = ability_metrics(batch)
    assert m["math/responses"] == 2 and m["code/responses"] == 4
    assert m["math/solve_frac"] == 0.5 and m["code/reward_mean"] == 0.5
    assert m["code/reason_timeout"] == 0.25 and m["code/reason_no_code"] == 0.25
    assert m["code/truncated_frac"] == 0.25 and m["math/truncated_frac"] == 0.0
    assert m["math/length_mean"] == pytest.approx(2.5)  # lengths 2, 3
    one_ability = batch.select(torch.tensor([0, 1]))
    assert ability_metrics(one_ability) == {}  # a math-only run keeps its metrics as they were
