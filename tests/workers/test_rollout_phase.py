"""The GPU memory hand-off between the actor and its colocated rollout engine, checked on the CPU with fakes that
record every call: wake the rollout's weights, push the actor's weights (only when they changed), offload the actor,
wake the KV cache, generate, sleep, onload the actor."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from or1.config.recipe import resolve
from or1.engines.rollout import FinishedRow
from or1.hybrid.batch import Batch
from or1.hybrid.sampling import SamplingRequest
from or1.workers.actor_rollout_ref import ActorRolloutRefWorker
from or1.workers.weight_sync import WeightSync


class FakeActor:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def named_full_params(self):
        self.calls.append("actor.gather")
        yield "w", torch.zeros(1)

    def offload(self) -> None:
        self.calls.append("actor.offload")

    def onload(self) -> None:
        self.calls.append("actor.onload")


class FakeRollout:
    pad_token_id = 0

    def __init__(self, calls: list[str], fail: bool = False) -> None:
        self.calls, self.fail = calls, fail

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"rollout.wake_up({','.join(tags or ['all'])})")

    def load_weights(self, weights) -> None:
        names = [name for name, _ in weights]  # drains the actor's gather, as the real engines do
        self.calls.append(f"rollout.load_weights({','.join(names)})")

    def stream_ids(self, prompts: list[list[int]], sampling) -> Iterator[list[FinishedRow]]:
        self.calls.append("rollout.generate")
        if self.fail:
            raise RuntimeError("out of memory")
        rows = len(prompts) * sampling.n
        for i in reversed(range(rows)):  # one row at a time, the last first: finishing order is not row order
            yield [FinishedRow(i, [7, 8 + i], False, [-0.5, -0.5])]

    def sleep(self) -> None:
        self.calls.append("rollout.sleep")


class FakeTokenizer:
    def batch_decode(self, rows, skip_special_tokens: bool = True) -> list[str]:
        return [" ".join(map(str, r)) for r in rows]


def worker(calls: list[str], *, stale: bool, fail: bool = False) -> ActorRolloutRefWorker:
    w = ActorRolloutRefWorker.__new__(ActorRolloutRefWorker)  # no process group, no models: only the hand-off
    w.cfg = CFG
    w.actor, w.rollout, w.tokenizer = FakeActor(calls), FakeRollout(calls, fail), FakeTokenizer()
    # the push self-test has its own tests (test_weight_sync.py); these fakes only record the hand-off order
    w.weight_sync = WeightSync(w.actor, w.rollout, w.tokenizer, check=False, tolerance=0.0)
    w.tp_group, w.tp_index = None, 0
    w.weights_version = 1 if stale else 0  # the engine holds version 0
    return w


CFG = resolve("tiny", 1, ["model.path=unused", "rollout.n=2"])
PROMPTS = Batch.from_dict({"prompt_ids": [[1, 2], [3]]})
STEP_1 = SamplingRequest.training(CFG, 1)


def test_generation_after_an_update_pushes_weights_between_the_two_wakes():
    calls: list[str] = []
    out = worker(calls, stale=True).generate_sequences(PROMPTS, STEP_1)
    assert calls == [
        "rollout.wake_up(weights)",
        "actor.gather",
        "rollout.load_weights(w)",
        "actor.offload",
        "rollout.wake_up(kv_cache)",
        "rollout.generate",
        "rollout.sleep",
        "actor.onload",
    ]
    assert out["responses"].shape == (4, 48) and out["response_length"].tolist() == [2, 2, 2, 2]


def test_finished_rows_stream_out_keyed_by_their_row_in_the_controllers_batch(monkeypatch):
    """Each finished row's reward inputs come out before the Batch, keyed by its row in the controller's whole batch
    (this rank's share of 2 prompts x n=2 starts at row rank x 4), with the text and the prompt's reward fields."""
    monkeypatch.setenv("RANK", "1")
    prompts = Batch.from_dict(
        {
            "prompt_ids": [[1, 2], [3]],
            "ability": ["math", "code"],
            "reward_model": [{"ground_truth": "1"}, {"ground_truth": "2"}],
        }
    )
    *parts, batch = worker([], stale=False).stream_sequences(prompts, STEP_1)
    rows = [row for part in parts for row in part]
    assert [row["key"] for row in rows] == [7, 6, 5, 4] and len(
        parts
    ) == 4  # a group per row of 4: ceil(4 / 8)
    for row in rows:
        local = row["key"] - 4
        assert row["response"] == batch["response_text"][local] == f"7 {8 + local}"
        assert row["ability"] == ["math", "code"][local // 2]
        assert row["reward_model"] == {"ground_truth": str(local // 2 + 1)}


def test_a_tensor_parallel_rank_keeps_its_own_rows_of_the_groups_call(monkeypatch):
    """With tensor parallelism the engine samples the whole group's prompts; the second rank of a group of two owns
    rows 4-7 of that call (2 prompts x n=2 each), and its Batch holds exactly those, in order."""
    monkeypatch.setenv("RANK", "1")
    w = worker([], stale=False)
    monkeypatch.setattr(w, "_tensor_parallel_share", lambda mine: ([[9], [9, 9]] + mine, slice(2, 4)))
    out = w.generate_sequences(PROMPTS, STEP_1)
    assert list(out["response_text"]) == [f"7 {8 + i}" for i in range(4, 8)]
    assert out["response_length"].tolist() == [2, 2, 2, 2]


def test_unchanged_weights_are_not_pushed_again():
    calls: list[str] = []
    w = worker(calls, stale=True)
    w.generate_sequences(PROMPTS, STEP_1)
    calls.clear()
    w.generate_sequences(PROMPTS, STEP_1)
    assert calls == [
        "rollout.wake_up(weights)",
        "actor.offload",
        "rollout.wake_up(kv_cache)",
        "rollout.generate",
        "rollout.sleep",
        "actor.onload",
    ]


def test_a_failed_generation_still_gives_the_gpu_back_to_the_actor():
    calls: list[str] = []
    with pytest.raises(RuntimeError, match="out of memory"):
        worker(calls, stale=False, fail=True).generate_sequences(PROMPTS, STEP_1)
    assert calls[-3:] == ["rollout.generate", "rollout.sleep", "actor.onload"]
