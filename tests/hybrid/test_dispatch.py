"""Dispatch split / collect without Ray: what each rank receives and what the controller gets back."""

import pytest
import torch

from or1.hybrid.batch import Batch
from or1.hybrid.dispatch import (
    Dispatch,
    MethodSpec,
    balanced_order,
    collect,
    method_spec,
    register,
    split_call,
)
from or1.hybrid.worker import Worker


def rows(n: int) -> Batch:
    return Batch(tensors={"x": torch.arange(n)}, non_tensor={"s": [f"r{i}" for i in range(n)]}, meta={"t": 1})


def run_dp(world: int, batch: Batch, fn) -> Batch:
    """What a DP_COMPUTE group does, with ranks simulated by a loop."""
    split = split_call(Dispatch.DP_COMPUTE, world, (batch,), {"scale": 10})
    outs = [fn(rank, *c.args, **c.kwargs) for rank, c in enumerate(split.calls)]
    return collect(Dispatch.DP_COMPUTE, outs, split)


def test_dp_compute_pads_five_rows_over_two_ranks_and_unpads_the_result():
    split = split_call(Dispatch.DP_COMPUTE, 2, (rows(5),), {})
    assert split.pad == 1
    parts = [c.args[0] for c in split.calls]
    assert [list(p["s"]) for p in parts] == [["r0", "r1", "r2"], ["r3", "r4", "r0"]]  # pad repeats row 0

    def double(rank, b, scale):
        return Batch(tensors={"y": b["x"] * scale, "rank": torch.full((len(b),), rank)}, meta=b.meta)

    out = run_dp(2, rows(5), double)
    assert torch.equal(out["y"], torch.arange(5) * 10)
    assert out["rank"].tolist() == [0, 0, 0, 1, 1] and out.meta == {"t": 1}


def test_dp_compute_drops_every_sample_of_a_padding_row():
    """A generation returns k rows per prompt: 30 problems on 8 ranks pad 2 prompts, whose 2k rows must all go (an
    avg@k of 30 problems counting two of them twice was what a per-row unpad gave)."""
    out = run_dp(8, rows(30), lambda rank, b, scale: b.only(["s"]).repeat(4))
    assert list(out["s"]) == [f"r{i}" for i in range(30) for _ in range(4)]


@pytest.mark.parametrize("n,world", [(4, 2), (1, 3), (7, 4), (8, 8)])
def test_dp_compute_round_trip_keeps_row_order(n, world):
    out = run_dp(world, rows(n), lambda rank, b, scale: b.only(["s"]))
    assert list(out["s"]) == [f"r{i}" for i in range(n)]


def test_dp_compute_splits_batch_kwargs_and_broadcasts_other_arguments():
    split = split_call(Dispatch.DP_COMPUTE, 2, (rows(4), 0.7), {"extra": rows(4), "flag": True})
    for rank, c in enumerate(split.calls):
        assert c.args[1] == 0.7 and c.kwargs["flag"] is True
        assert c.kwargs["extra"]["x"].tolist() == [2 * rank, 2 * rank + 1]


def test_dp_compute_errors_without_a_batch_or_with_mismatched_lengths():
    with pytest.raises(TypeError, match="needs at least one Batch"):
        split_call(Dispatch.DP_COMPUTE, 2, (1,), {})
    with pytest.raises(ValueError, match="different lengths"):
        split_call(Dispatch.DP_COMPUTE, 2, (rows(4), rows(3)), {})


def test_dp_compute_non_batch_results_come_back_as_a_list():
    split = split_call(Dispatch.DP_COMPUTE, 2, (rows(3),), {})
    assert collect(Dispatch.DP_COMPUTE, [{"loss": 1.0}, {"loss": 2.0}], split) == [
        {"loss": 1.0},
        {"loss": 2.0},
    ]


def test_one_to_all_sends_the_same_arguments():
    split = split_call(Dispatch.ONE_TO_ALL, 3, (1, "a"), {"k": 2})
    assert [(c.args, c.kwargs) for c in split.calls] == [((1, "a"), {"k": 2})] * 3
    assert collect(Dispatch.ONE_TO_ALL, ["r0", "r1", "r2"]) == ["r0", "r1", "r2"]


def test_register_marks_methods_and_rejects_non_dispatch_values():
    class Toy(Worker):
        @register(Dispatch.DP_COMPUTE)
        def compute(self, batch):
            return batch

        def plain(self):
            return 1

    assert method_spec(Toy, "compute") == MethodSpec(Dispatch.DP_COMPUTE)
    assert method_spec(Toy, "worker_info") == MethodSpec(Dispatch.ONE_TO_ALL)
    assert method_spec(Toy, "plain") is None
    with pytest.raises(TypeError, match="takes a Dispatch"):
        register("dp_compute")


def test_balanced_order_gives_every_share_about_the_same_length_sorted():
    # a batch ordered by length: its contiguous halves would be all short and all long
    lengths = [10, 11, 12, 13, 30, 31, 32, 33]
    order = balanced_order(lengths, 2)
    assert sorted(order) == list(range(8))
    shares = [[lengths[i] for i in order[:4]], [lengths[i] for i in order[4:]]]
    assert shares == [[10, 13, 30, 33], [11, 12, 31, 32]]  # 86 tokens each, shortest first
    assert balanced_order(lengths, 1) == list(range(8))
    many = [(7 * k) % 61 + 20 for k in range(112)]
    order = balanced_order(many, 4)
    sums = [sum(many[i] for i in order[r * 28 : (r + 1) * 28]) for r in range(4)]
    assert max(sums) - min(sums) <= max(many) - min(many)
    assert all(len(order[r * 28 : (r + 1) * 28]) == 28 for r in range(4))
