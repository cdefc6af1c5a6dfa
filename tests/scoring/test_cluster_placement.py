"""Cluster placement of the rewards on two Ray nodes on this machine (ray.cluster_utils.Cluster): rows scored on
both nodes and equal to head placement's; a node lost mid-scoring, a hung scorer and a scorer that never answers.

The scorer classes with an injected delay or hang are defined inside the tests: Ray ships them to the nodes by
value, and no product setting can turn them on.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Hashable
from pathlib import Path

import pytest

from or1.config.schema import RewardConfig
from or1.data.synthetic import code_validation_rows, math_validation_rows
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.cluster import ray_session
from or1.sandbox.pool import unavailable
from or1.scoring import RewardManager
from or1.scoring.cluster_placement import short_node
from or1.scoring.scorer import Scorer
from or1.trainer.phases import scoring_metrics
from run_files import metrics, tiny_run, two_node_cluster

pytestmark = pytest.mark.multinode

HEAD_CPUS, WORKER_CPUS = 2, 1  # the head: one rank and a scorer; the worker node: a scorer
RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster(HEAD_CPUS, WORKER_CPUS) as (c, worker_node), ray_session(c.address):
        yield c, worker_node


def config(**extra) -> RewardConfig:
    return RewardConfig(**{"workers": 1, "placement": "cluster", "scorer_cpus": 1, **extra})


def math_rows(count: int) -> list[dict]:
    """`count` math rows, every third answered right."""
    rows = []
    for i, row in enumerate(math_validation_rows()[:count]):
        response = row["extra_info"]["solution"] if i % 3 == 0 else f"\\boxed{{{1000 + i}}}"
        rows.append({"ability": "math", "response": response, "reward_model": dict(row["reward_model"])})
    return rows


def code_rows(count: int) -> list[dict]:
    """`count` code rows, every other one a passing program."""
    rows = []
    for i, row in enumerate(code_validation_rows()[:count]):
        program = row["extra_info"]["reference_solution"] if i % 2 == 0 else "print(1000)\n"
        rows.append(
            {
                "ability": "code",
                "response": f"```python\n{program}```",
                "reward_model": dict(row["reward_model"]),
            }
        )
    return rows


def head_scores(rows: list[dict]) -> list[tuple[float, str]]:
    session = RewardManager(RewardConfig(workers=1)).session()
    session.submit(range(len(rows)), rows)
    scored = session.finish()
    return [(scored.results[i].score, scored.results[i].reason) for i in range(len(rows))]


def wait_for_scorers(manager: RewardManager, nodes: int, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while len(manager.scorers()) < nodes:
        assert time.monotonic() < end, f"scorers ready: {manager.scorers()}"
        time.sleep(0.2)


def outcomes(scored, keys: list[Hashable]) -> list[tuple[float, str]]:
    return [(scored.results[k].score, scored.results[k].reason) for k in keys]


def test_rows_are_scored_on_both_nodes_as_on_the_head(cluster) -> None:
    c, worker_node = cluster
    if unavailable("local"):
        pytest.skip(f"local sandbox: {unavailable('local')}")
    rows = [*math_rows(8), *code_rows(4)]
    rows = [rows[i] for i in (0, 8, 1, 2, 9, 3, 4, 10, 5, 6, 11, 7)]  # abilities interleaved
    manager = RewardManager(config())
    try:
        wait_for_scorers(manager, 2)
        batch = Batch.from_dict(
            {
                "ability": [r["ability"] for r in rows],
                "response_text": [r["response"] for r in rows],
                "reward_model": [r["reward_model"] for r in rows],
            }
        )
        scored = manager.compute_scores(batch)
    finally:
        manager.close()
    got = list(zip(scored.tensors["scores"].tolist(), scored.non_tensor["score_reason"], strict=True))
    assert got == head_scores(rows)
    assert {reason for _, reason in got} >= {"correct", "wrong_answer", "wrong_output"}
    metrics = scoring_metrics(scored)
    nodes = {short_node(c.head_node.node_id), short_node(worker_node.node_id)}
    assert {
        k.removeprefix("reward/rows_node_") for k in metrics if k.startswith("reward/rows_node_")
    } == nodes
    assert all(metrics[f"reward/rows_node_{n}"] > 0 for n in nodes)
    assert sum(metrics[f"reward/rows_node_{n}"] for n in nodes) == len(rows)


def test_a_hung_scorer_is_replaced_and_its_rows_scored_again(cluster, tmp_path: Path) -> None:
    hung = tmp_path / "hung"

    class HangsOnce(Scorer):
        """The first chunk any scorer gets hangs its scorer for good; every later one scores normally."""

        def score(self, rows):
            if not hung.exists():
                hung.write_text(self.node)
                time.sleep(3600)
            return super().score(rows)

    rows = math_rows(12)
    manager = RewardManager(config(math_timeout=1.0, scorer_grace=3.0), scorer_cls=HangsOnce)
    try:
        wait_for_scorers(manager, 2)
        session = manager.session()
        session.submit([f"row{i}" for i in range(12)], rows)
        scored = session.finish()
        wait_for_scorers(manager, 2)  # the hung scorer's replacement, on the same node
    finally:
        manager.close()
    assert hung.exists()
    keys = [f"row{i}" for i in range(12)]
    assert sorted(scored.results) == sorted(keys) and sum(scored.node_rows.values()) == 12
    assert outcomes(scored, keys) == head_scores(rows)


def test_scoring_that_cannot_finish_fails_in_one_line_naming_rows_and_scorer(cluster) -> None:
    class NeverAnswers(Scorer):
        def score(self, rows):
            time.sleep(3600)

    manager = RewardManager(
        config(math_timeout=1.0, scorer_grace=2.0, scoring_retries=1), scorer_cls=NeverAnswers
    )
    try:
        wait_for_scorers(manager, 2)
        session = manager.session()
        session.submit(["p7-s0", "p7-s1"], math_rows(2))
        with pytest.raises(UserError) as failed:
            session.finish()
    finally:
        manager.close()
    message = str(failed.value)
    assert "\n" not in message
    assert message.startswith(
        "scoring could not finish: math rows p7-s0, p7-s1 failed 2 times, last on scorer "
    )
    assert "no answer within 4 s" in message


def test_the_tiny_stage_scores_on_every_node_with_placement_cluster(
    cluster, tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    c, worker_node = cluster
    overrides = tiny_run(
        tiny_model_dir,
        tiny_data_dir / "train.parquet",
        f"data.validation.sets=[{tiny_data_dir / 'validation.parquet'}]",  # scored on the cluster too
        "data.validation.max_problems=4",
        "data.validation.n=2",
        "trainer.steps=2",
        "trainer.devices_per_node=1",
        "reward.placement=cluster",
        "reward.scorer_cpus=1",
    )
    cli = [sys.executable, "-m", "or1.cli", "train", "--recipe", RECIPE, "--stage", "1"]
    cli += ["--run-dir", str(tmp_path / "run"), "--ray-address", c.address]
    done = subprocess.run(
        cli + [x for o in overrides for x in ("--set", o)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    nodes = [f"reward/rows_node_{short_node(n.node_id)}" for n in (c.head_node, worker_node)]
    steps = [m for m in metrics(tmp_path / "run") if "batch/sampled" in m]  # not step 0's validation
    assert len(steps) == 2
    for step in steps:
        assert all(step[n] > 0 for n in nodes) and sum(step[n] for n in nodes) == step["batch/sampled"]


def test_a_node_lost_mid_scoring_leaves_every_row_scored_once(cluster, tmp_path: Path) -> None:
    """Last in this module: it removes the worker node."""
    c, worker_node = cluster
    marks = tmp_path / "marks"
    marks.mkdir()

    class Slow(Scorer):
        """Each chunk takes 2 s more, after leaving a mark naming its node."""

        def score(self, rows):
            (marks / f"{self.node}-{time.monotonic_ns()}").touch()
            time.sleep(2.0)
            return super().score(rows)

    rows = math_rows(12)
    keys = list(range(12))
    manager = RewardManager(config(scorer_grace=20.0), scorer_cls=Slow)
    try:
        wait_for_scorers(manager, 2)
        session = manager.session()
        session.submit(keys, rows)
        end = time.monotonic() + 60
        # its second chunk started: the first is scored, the second (and a third queued behind it) outstanding
        while sum(m.name.startswith(worker_node.node_id) for m in marks.iterdir()) < 2:
            assert time.monotonic() < end, "the worker node's scorer never started a second chunk"
            time.sleep(0.05)
        c.remove_node(worker_node, allow_graceful=False)  # as a machine that loses power, mid-chunk
        scored = session.finish()
    finally:
        manager.close()
    assert sorted(scored.results) == keys and sum(scored.node_rows.values()) == 12
    assert outcomes(scored, keys) == head_scores(rows)
    # the lost node's first chunk counts once, for that node; its outstanding chunks were scored on the head
    assert scored.node_rows == {short_node(worker_node.node_id): 2, short_node(c.head_node.node_id): 10}
