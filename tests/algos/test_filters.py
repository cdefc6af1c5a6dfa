"""Rejection sampling with trimming, DAPO-style refill, prompt statistics and online filtering, by hand."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from or1.algos.filters import RefillBuffer, group_reward_stats, rejection_keep_indices
from or1.algos.online_filter import PromptStats, online_filter
from or1.errors import UserError
from or1.layout import PROMPT_STATS_FILE


def test_group_reward_stats():
    # a all 1, b all 0, c mixed, d all 0.5 (equal; partial credit is not solved, so d counts as solve-none)
    rewards = [1, 1, 0, 0, 1, 0, 0.5, 0.5]
    stats = group_reward_stats(rewards, ["a", "a", "b", "b", "c", "c", "d", "d"])
    assert stats.all_equal.tolist() == [True, True, False, True]
    assert stats.solve_all.tolist() == [True, False, False, False]
    assert stats.solve_none.tolist() == [False, True, False, True]
    assert stats.means.tolist() == [1.0, 0.0, 0.5, 0.5]
    assert (stats.all_equal_frac, stats.solve_all_frac, stats.solve_none_frac) == (0.75, 0.25, 0.5)
    # tensor ids are compared by value
    assert group_reward_stats(rewards[:4], torch.tensor([5, 5, 6, 6])).num_groups == 2


# Six groups of 4 in batch order: g0 all 1, g1 mixed, g2 all 0, g3..g5 mixed -> 4 informative groups, 16 responses
SIX = torch.tensor(
    [1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0], dtype=torch.float32
)
SIX_IDS = np.repeat([f"g{i}" for i in range(6)], 4)


def test_rejection_drops_equal_groups():
    keep, st = rejection_keep_indices(SIX, SIX_IDS, multiple=8)
    assert keep.tolist() == [4, 5, 6, 7] + list(range(12, 24))
    assert (st.num_groups, st.kept_groups, st.kept_responses, st.trimmed) == (6, 4, 16, 0)
    assert st.zero_variance_frac == pytest.approx(2 / 6)
    assert st.dropped_frac == pytest.approx(8 / 24)
    assert (st.solve_all_frac, st.solve_none_frac) == pytest.approx((1 / 6, 1 / 6))
    assert not st.skip


def test_rejection_trims_whole_groups_to_the_multiple():
    # 16 informative responses on 12 ranks: the largest multiple is 12 = 3 whole groups; the last (g5) goes
    keep, st = rejection_keep_indices(SIX, SIX_IDS, multiple=12)
    assert keep.tolist() == [4, 5, 6, 7] + list(range(12, 20))
    assert (st.kept_responses, st.kept_groups, st.trimmed) == (12, 3, 4)
    assert st.dropped_frac == pytest.approx(12 / 24)


def test_rejection_with_rng_drops_a_random_whole_group_deterministically():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0] * 5)  # 5 informative groups of 4, 8 ranks -> keep 4 groups
    ids = np.repeat(np.arange(5), 4)
    keep, st = rejection_keep_indices(rewards, ids, multiple=8, rng=np.random.default_rng(3))
    dropped = int(np.random.default_rng(3).permutation(5)[-1])  # the lowest-priority group in the drawn order
    assert keep.tolist() == [i for i in range(20) if i // 4 != dropped]
    again, _ = rejection_keep_indices(rewards, ids, multiple=8, rng=np.random.default_rng(3))
    assert np.array_equal(keep, again)
    assert st.kept_responses == 16 and st.kept_groups == 4


def test_rejection_picks_the_cheapest_whole_groups_for_unequal_sizes():
    # sizes 2, 3, 3 on 3 ranks: 8 -> 6 by dropping the group of 2 (first in order), not one of the later 3s
    rewards = [1, 0, 1, 0, 0, 1, 0, 0]
    keep, st = rejection_keep_indices(rewards, ["a", "a", "b", "b", "b", "c", "c", "c"], multiple=3)
    assert keep.tolist() == [2, 3, 4, 5, 6, 7]
    assert st.trimmed == 2
    # sizes 3, 2, 3, 2 on 4 ranks: 10 -> 8 by dropping a group of 2; the later one goes
    rewards = [1, 0, 0, 1, 0, 1, 0, 0, 1, 0]
    keep, _ = rejection_keep_indices(rewards, list("aaabbcccdd"), multiple=4)
    assert keep.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]


def test_rejection_cuts_responses_when_no_whole_group_choice_fits():
    # three informative groups of 3 on 4 ranks: whole groups give 0 (3, 6, 9 are no multiples of 4) but 8 responses
    # fit: keep groups 0 and 1 whole and the first 2 responses of group 2 (Skywork trims single responses)
    rewards = [1, 0, 0, 0, 1, 1, 1, 0, 1]
    keep, st = rejection_keep_indices(rewards, [0, 0, 0, 1, 1, 1, 2, 2, 2], multiple=4)
    assert keep.tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert (st.kept_responses, st.kept_groups, st.trimmed) == (8, 3, 1)


def test_rejection_empty_means_skip():
    keep, st = rejection_keep_indices([1, 0, 1, 1], [0, 0, 0, 0], multiple=8)  # 4 responses < 8 ranks
    assert keep.tolist() == [] and st.skip and st.dropped_frac == 1.0
    keep, st = rejection_keep_indices([1, 1, 0, 0], [0, 0, 1, 1], multiple=1)  # all groups equal
    assert len(keep) == 0 and st.skip and st.zero_variance_frac == 1.0
    assert (st.solve_all_frac, st.solve_none_frac) == (0.5, 0.5)


def test_rejection_trim_only_keeps_equal_groups():
    keep, st = rejection_keep_indices(SIX, SIX_IDS, multiple=8, drop_equal=False)
    assert len(keep) == 24 and st.zero_variance_frac == 0.0


def test_refill_collects_groups_over_rounds_up_to_the_target():
    buf = RefillBuffer(target_groups=3, max_rounds=2)
    assert buf.needs_more
    # round 1: a mixed, b all 1, c mixed -> keep a, c (2 of 3 groups)
    keep = buf.add(torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0]), ["a", "a", "b", "b", "c", "c"])
    assert keep.tolist() == [0, 1, 4, 5]
    assert buf.num_groups == 2 and buf.needs_more
    # round 2: d all 0, e mixed, f mixed -> room for one: e; f is beyond the target
    keep = buf.add(torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 0.0]), ["d", "d", "e", "e", "f", "f"])
    assert keep.tolist() == [2, 3]
    assert buf.full and not buf.needs_more and buf.num_responses == 6
    m = buf.metrics()
    assert (m["refill_rounds"], m["refill_groups"], m["refill_fill_frac"]) == (2.0, 3.0, 1.0)
    assert (m["solve_all_frac"], m["solve_none_frac"]) == (1 / 6, 1 / 6)


def test_refill_stops_after_max_rounds():
    buf = RefillBuffer(target_groups=5, max_rounds=1)
    for _ in range(2):  # the normal round plus one extra
        assert buf.needs_more
        assert buf.add([1.0, 0.0, 1.0, 1.0], [0, 0, 1, 1]).tolist() == [0, 1]
    assert buf.exhausted and not buf.full and not buf.needs_more and buf.num_groups == 2
    with pytest.raises(RuntimeError):
        buf.add([1.0, 0.0], [0, 0])
    # max_rounds 0 is Skywork's behaviour: one round, no refill
    assert not RefillBuffer(target_groups=5, max_rounds=0).exhausted


def test_prompt_stats_accumulate_save_and_load(tmp_path):
    stats = PromptStats()
    stats.update(["p0", "p0", "p1", "p1"], torch.tensor([1.0, 1.0, 0.0, 1.0]))
    stats.update(["p0", "p0", "p2", "p2"], [1.0, 1.0, 0.0, 0.0])
    assert (stats.attempts, stats.solved) == ({"p0": 4, "p1": 2, "p2": 2}, {"p0": 4, "p1": 1, "p2": 0})
    assert (stats.solve_rate("p0"), stats.solve_rate("p1"), stats.solve_rate("nope")) == (1.0, 0.5, None)
    path = tmp_path / "stage1" / PROMPT_STATS_FILE
    stats.save(path)
    table = pq.read_table(path)
    assert table.column_names == ["uid", "attempts", "solved"]
    assert table.column("uid").to_pylist() == ["p0", "p1", "p2"]
    loaded = PromptStats.load(path)
    assert (loaded.attempts, loaded.solved) == (stats.attempts, stats.solved)
    assert not list(tmp_path.glob("stage1/*.tmp"))
    resumed = PromptStats()
    resumed.load_state_dict(json.loads(json.dumps(stats.state_dict())))
    assert (resumed.attempts, resumed.solved) == (stats.attempts, stats.solved)
    with pytest.raises(UserError, match="previous stage"):
        PromptStats.load(tmp_path / "missing.parquet")


def test_online_filter_drops_always_solved_prompts():
    stats = PromptStats()
    # p0 4/4, p1 3/4, p2 0/4, p3 8/8; p4 never sampled
    stats.update(["p0"] * 4 + ["p1"] * 4 + ["p2"] * 4, [1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
    stats.update(["p3"] * 8, [1] * 8)
    uids = ["p0", "p1", "p2", "p3", "p4"]
    kept, report = online_filter(uids, stats)
    assert kept == ["p1", "p2", "p4"]
    assert (report.total, report.seen, report.dropped, report.kept, report.threshold) == (5, 4, 2, 3, 1.0)
    kept, report = online_filter(uids, stats, threshold=0.75)  # 3/4 >= 0.75 goes too
    assert kept == ["p2", "p4"] and report.dropped == 3
    with pytest.raises(ValueError):
        online_filter(uids, stats, threshold=0.0)
