"""Partial rollout (rollout.partial, trainer/partial.py) on the separate placement, against fake replicas whose
responses have lengths set by their prompts: the rounds' versions and budgets per token, the bound on a response's
oldest token under a slow trainer and a slow rollout, the same tokens whatever the timing or a replica's death, the
per-token correction weights, the recipe checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from test_async import STEPS, FakeActor, command, run, run_killing_a_sampling_replica, same_trajectory

from or1.algos.rollout_correction import CorrectionSettings, correct
from or1.config.recipe import resolve
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import (
    ABILITY,
    NEW_IDS,
    NEW_LOG_PROBS,
    POLICY_VERSION,
    PROMPT_IDS,
    PROMPT_KEY,
    RESPONSE_MASK,
    RESPONSE_SO_FAR,
    RESPONSE_TEXT,
    RESPONSES,
    REWARD_MODEL,
    REWARDS,
    ROLLOUT_LOG_PROBS,
    ROUND_BUDGET,
    STOPPED,
    TOKEN_VERSIONS,
    TRUNCATED,
    UID,
)
from or1.hybrid.worker_group import WorkerError
from or1.trainer.separate import Separate
from or1.trainer.step_log import PhaseTimer
from or1.trainer.step_sampler import Sampled
from run_files import assert_same_weights, kill_while_writing, weights

MAX = 8  # the response budget
STOP = 99  # the fake engine's stop token


def config(k: int, steps: int, tokens: int = 2):
    return resolve(
        "tiny",
        1,
        [
            "model.path=unused",
            "rollout.placement=separate",
            f"rollout.max_staleness={k}",
            "rollout.partial=true",
            f"rollout.partial_tokens={tokens}",
            f"rollout.max_response_length={MAX}",
            "rollout.n=2",
            "algorithm.rollout_correction.is_level=token",
            f"trainer.steps={steps}",
            "rollout.weight_transfer=object_store",  # FakeActor publishes a token through publish_weights
        ],
    )


def behaviour_log_prob(version: int, position: int) -> float:
    """The fake engine's log-prob of a response's token at `position`, sampled by weights `version`."""
    return -0.1 * (version + 1) - 0.01 * position


class FakeReplicas:
    """Each response is as long as its prompt's one token says (at most MAX; a stop token ends the shorter ones);
    its tokens are the sampling version + 100. A round streams its rows' results shortest first, `delay` seconds
    a round; the call numbered `die_on_call` dies after streaming half of them."""

    def __init__(self, delay: float = 0.0, die_on_call: int | None = None) -> None:
        self.delay, self.die_on_call, self.calls, self.version = delay, die_on_call, 0, 0
        self.rounds: list[tuple[int, list[int]]] = []  # (version, budgets) of each call

    def load_weights(self, version: int, published: tuple) -> list[int]:
        assert published[0] == f"weights-{version}"
        self.version = version
        return [version]

    def pad_token_id(self) -> list[int]:
        return [0]

    def stream(self, method, on_item, rows: Batch, request) -> list[int]:
        assert method.__name__ == "continue_responses"
        self.calls += 1
        time.sleep(self.delay)
        budgets = rows.tensors[ROUND_BUDGET].tolist()
        self.rounds.append((self.version, budgets))
        results = []
        for row, ((length,), so_far, budget) in enumerate(
            zip(rows[PROMPT_IDS], rows[RESPONSE_SO_FAR], budgets, strict=True)
        ):
            count = min(budget, length - len(so_far))
            ends = len(so_far) + count == length < MAX
            final = ends or len(so_far) + count == MAX
            results.append(
                {
                    "row": row,
                    NEW_IDS: [self.version + 100] * (count - ends) + [STOP] * ends,
                    NEW_LOG_PROBS: [behaviour_log_prob(self.version, len(so_far) + i) for i in range(count)],
                    STOPPED: ends,
                    POLICY_VERSION: self.version,
                    RESPONSE_TEXT: "done" if final else None,
                }
            )
        results.sort(key=lambda r: len(r[NEW_IDS]))
        for k, result in enumerate(results):
            if self.calls == self.die_on_call and k == len(results) // 2:
                raise WorkerError("rollout", 0, "continue_responses", "its actor process died", died=True)
            on_item(0, [result])
        return [len(rows)]

    def shutdown(self) -> None:
        pass


class FakeLoader:
    """Step s's prompts: two, whose responses are 3 and MAX tokens long."""

    def __init__(self) -> None:
        self.position = 0

    def next_batch(self, step: int, round_: int = 0) -> Batch:
        self.position = step
        return Batch.from_dict(
            {
                PROMPT_IDS: [[3], [MAX]],
                UID: [f"{step}a", f"{step}b"],
                PROMPT_KEY: ["a", "b"],
                ABILITY: ["math", "math"],
                REWARD_MODEL: [{"ground_truth": "1"}] * 2,
            }
        )

    def state_dict(self) -> dict[str, int]:
        return {"position": self.position}


class FakeSession:
    def __init__(self) -> None:
        self.keys: list[int] = []

    def submit(self, keys, rows) -> None:
        assert not set(keys) & set(self.keys), "a response was scored twice"
        self.keys += keys


class FakeRewards:
    def __init__(self) -> None:
        self.sessions: list[FakeSession] = []

    def session(self) -> FakeSession:
        self.sessions.append(FakeSession())
        return self.sessions[-1]


class FakeSampler:
    """StepSampler's parts that partial rollout uses: the loader, the scoring sessions and `score`."""

    def __init__(self, cfg) -> None:
        self.cfg, self.loader, self.rewards = cfg, FakeLoader(), FakeRewards()

    def score(self, batch: Batch, session: FakeSession, timer: PhaseTimer) -> Batch:
        assert sorted(session.keys) == list(range(len(batch))), "every response streamed once as it ended"
        return batch.union(Batch({REWARDS: torch.zeros(len(batch))}))


def run_partial(k: int, steps: int, *, train_s=0.0, sample_s=0.0, die_on_call=None, tokens=2):
    """Train `steps` steps on partial rollout against fake replicas: each step's Sampled, and the replicas."""
    actor, sampler = FakeActor(), FakeSampler(config(k, steps, tokens))
    replicas, started = FakeReplicas(sample_s, die_on_call), []

    def start_replicas():
        started.append(FakeReplicas(sample_s))
        return started[-1]

    pipeline = Separate(actor, sampler, replicas, start_replicas, max_restarts=1)
    pipeline.begin(0)
    taken: list[Sampled] = []
    try:
        for step in range(1, steps + 1):
            taken.append(pipeline.take(step, PhaseTimer()))
            time.sleep(train_s)
            actor.version = step
            pipeline.trained(step)
    finally:
        pipeline.end()
    return taken, [replicas, *started], pipeline


def test_a_response_continues_with_the_next_versions_and_records_each_tokens_own():
    """k = 1, 2 tokens a round: step s's responses get 2 tokens from the weights after step s-2, then run to their end
    in round s+1 on the weights after step s-1; every token keeps its own version and log-prob."""
    taken, (replicas,), _ = run_partial(1, 5)
    for step, sampled in enumerate(taken, start=1):
        batch = sampled.batch
        old, new = max(0, step - 2), step - 1
        lengths = batch.tensors[RESPONSE_MASK].sum(-1).tolist()
        assert lengths == [3, 3, MAX, MAX]
        for row, length in enumerate(lengths):
            versions = [old, old] + [new] * (length - 2)
            assert batch.tensors[TOKEN_VERSIONS][row, :length].tolist() == versions
            want = [behaviour_log_prob(v, i) for i, v in enumerate(versions)]
            assert batch.tensors[ROLLOUT_LOG_PROBS][row, :length].tolist() == pytest.approx(want)
        assert batch.tensors[RESPONSES][0, :3].tolist() == [old + 100, old + 100, STOP]
        assert batch.tensors[RESPONSES][2, :MAX].tolist() == [old + 100] * 2 + [new + 100] * (MAX - 2)
        assert batch.tensors[TRUNCATED].tolist() == [False, False, True, True]
        assert batch.tensors[POLICY_VERSION].tolist() == [old] * 4  # the oldest token's
        stale = min(1, step - 1)
        assert sampled.metrics["async/token_staleness_max"] == sampled.metrics["async/staleness_max"] == stale
        assert sampled.metrics["async/versions_per_group_max"] == (2 if step > 1 else 1)
        assert sampled.loader_state == {"position": step}
    # round r: step r-1's four responses up to the budget's end (6 tokens left), and step r's four new ones 2 tokens each
    assert replicas.rounds[0] == (0, [2, 2, 2, 2])
    assert replicas.rounds[2] == (1, [6, 6, 6, 6, 2, 2, 2, 2])


def test_the_correction_weighs_each_token_by_the_version_that_sampled_it():
    """Token-level TIS on a batch whose responses mixed two versions equals the hand-built weights
    exp(log pi_old - log pi_version(token)), token by token."""
    taken, *_ = run_partial(1, 3)
    batch = taken[2].batch
    mask = batch.tensors[RESPONSE_MASK]
    old = torch.full(mask.shape, -0.15) * mask
    settings = CorrectionSettings("token", 10.0, "off", 2.0, 0.5)
    weights, *_ = correct(old, batch.tensors[ROLLOUT_LOG_PROBS], mask, settings)
    for row in range(len(batch)):
        for t in range(int(mask[row].sum())):
            v = int(batch.tensors[TOKEN_VERSIONS][row, t])
            assert float(weights[row, t]) == pytest.approx(
                torch.exp(torch.tensor(-0.15 - behaviour_log_prob(v, t)))
            )
    assert len({int(v) for v in batch.tensors[TOKEN_VERSIONS][mask.bool()]}) == 2


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("slow", ["trainer", "rollout"])
def test_the_oldest_token_stays_within_k_and_the_tokens_never_depend_on_timing(k, slow):
    train_s, sample_s = (0.03, 0.0) if slow == "trainer" else (0.0, 0.03)
    taken, *_ = run_partial(k, 7, train_s=train_s, sample_s=sample_s)
    reference, *_ = run_partial(k, 7)
    for step, (sampled, same) in enumerate(zip(taken, reference, strict=True), start=1):
        assert (
            sampled.metrics["async/token_staleness_max"]
            == sampled.metrics["async/staleness_max"]
            == min(k, step - 1)
        )
        for column in (RESPONSES, TOKEN_VERSIONS, ROLLOUT_LOG_PROBS):
            assert torch.equal(sampled.batch.tensors[column], same.batch.tensors[column])
    if k == 2:  # a MAX-token response spans three rounds: 2 + 2 tokens, then to its end
        versions = taken[-1].batch.tensors[TOKEN_VERSIONS][-1].tolist()
        assert versions == [4, 4, 5, 5, 6, 6, 6, 6]


def test_a_replica_that_dies_mid_round_is_replaced_and_the_round_sampled_again():
    taken, replicas, pipeline = run_partial(1, 5, die_on_call=3)
    reference, *_ = run_partial(1, 5)
    assert pipeline.restarts == 1 and len(replicas) == 2
    for sampled, same in zip(taken, reference, strict=True):
        for column in (RESPONSES, TOKEN_VERSIONS, ROLLOUT_LOG_PROBS):
            assert torch.equal(sampled.batch.tensors[column], same.batch.tensors[column])


def test_rounds_as_long_as_the_budget_sample_as_the_separate_placement_does():
    """partial_tokens = the budget: every response ends in its first round, on the version the non-partial schedule
    gives its step."""
    taken, (replicas,), _ = run_partial(1, 4, tokens=MAX)
    for step, sampled in enumerate(taken, start=1):
        assert set(
            sampled.batch.tensors[TOKEN_VERSIONS][sampled.batch.tensors[RESPONSE_MASK].bool()].tolist()
        ) == {max(0, step - 2)}
    assert [len(budgets) for _, budgets in replicas.rounds] == [4, 4, 4, 4]


def test_partial_rollout_needs_staleness_and_no_refill():
    with pytest.raises(UserError, match="max_staleness >= 1"):
        resolve("tiny", 1, ["model.path=unused", "rollout.placement=separate", "rollout.partial=true"])
    with pytest.raises(UserError, match="algorithm.refill"):
        config_with = ["algorithm.refill=true", "algorithm.rejection_sampling=true"]
        resolve(
            "tiny",
            1,
            [
                "model.path=unused",
                "rollout.placement=separate",
                "rollout.max_staleness=1",
                "rollout.partial=true",
                "algorithm.rollout_correction.is_level=token",
                *config_with,
            ],
        )
    assert config(1, 4, tokens=2).rollout.round_tokens == 2


# ---- through or1 train -------------------------------------------------------------------------------------------
PARTIAL = ["--set", "rollout.partial=true", "--set", "rollout.partial_tokens=8"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, tiny_data_dir) -> Path:
    run_dir = tmp_path_factory.mktemp("partial") / "whole"
    run([*command(run_dir, tiny_model_dir, tiny_data_dir, "never"), *PARTIAL])
    return run_dir


def test_a_partial_run_mixes_versions_within_the_bound(uninterrupted):
    """8 of the 48 tokens a round, k = 1: from step 2 on, responses longer than 8 tokens carry the weights after step
    s-2 and s-1; no token is more than one update old."""
    records = [r for r in same_trajectory(uninterrupted) if "async/token_staleness_max" in r]
    assert [r["async/token_staleness_max"] for r in records] == [0, 1, 1, 1]
    assert [r["async/versions_per_group_max"] for r in records] == [1, 2, 2, 2]
    assert all(0 < r["async/token_staleness_mean"] < 1 for r in records[1:])
    for step in range(1, STEPS + 1):
        rows = [json.loads(x) for x in (uninterrupted / "stage1" / "samples" / f"step_{step}.jsonl").open()]
        assert {r["policy_version"] for r in rows} == {max(0, step - 2)}  # a response's oldest token


def test_resume_mid_partial_response_with_a_replica_killed_ends_where_the_uninterrupted_run_ends(
    tmp_path, uninterrupted, tiny_model_dir, tiny_data_dir
):
    """Killed while writing step 3's checkpoint (the rounds the replicas ran ahead, their responses partly sampled,
    die with it), resumed from step 2: rounds start again at 3. In the resumed run a replica dies in a round (most
    likely the first): it is replaced and sent the older version the round samples with, the round is sampled again
    for the responses it had not returned, and the run ends on the same metrics and weights. A death in a round that
    holds two steps' responses is checked against fake replicas above."""
    run_dir = tmp_path / "resumed"
    kill_while_writing(
        [*command(run_dir, tiny_model_dir, tiny_data_dir, "never"), *PARTIAL],
        run_dir / "stage1" / "checkpoints",
        3,
    )
    run_killing_a_sampling_replica(
        [*command(run_dir, tiny_model_dir, tiny_data_dir, "auto"), *PARTIAL], run_dir
    )
    last = json.loads((run_dir / "stage1" / "metrics.jsonl").read_text().splitlines()[-1])
    assert last["async/replica_restarts"] == 1
    assert same_trajectory(run_dir) == same_trajectory(uninterrupted)
    assert_same_weights(weights(run_dir / "stage1" / "final"), weights(uninterrupted / "stage1" / "final"))
