"""Two Ray nodes on one machine: a head and a worker node (ray.cluster_utils.Cluster, each with its own CPUs).

The pool of nnodes=2 x devices_per_node=1 puts one rank on each node, and `or1 train --ray-address` on that cluster
ends bit-equal (metrics and final weights) to the same stage on one node with nnodes=1 x devices_per_node=2: the
same two gloo ranks compute the same shares with one thread each, and a two-rank all-reduce adds the same two
numbers whichever machine each lives on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from or1.errors import UserError
from or1.hybrid.cluster import ray_session
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.worker import Worker
from or1.hybrid.worker_group import WorkerGroup
from or1.trainer.checkpoint import check_visible
from run_files import assert_same_weights, metrics, tiny_run, two_node_cluster, wait_for_checkpoint, weights

pytestmark = pytest.mark.multinode

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")
HEAD_CPUS, WORKER_CPUS = 2, 1  # only the head can host a 2-CPU rank: the refused pool below


class WhereAmI(Worker):
    def __init__(self) -> None:
        self.init_distributed()

    @register(Dispatch.ONE_TO_ALL)
    def node(self) -> tuple[str, float]:
        """This rank's Ray node and the sum of ranks over gloo (the two nodes reach each other)."""
        total = torch.tensor([float(self.rank + 1)])
        torch.distributed.all_reduce(total)
        return ray.get_runtime_context().get_node_id(), float(total)


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster(HEAD_CPUS, WORKER_CPUS) as nodes:
        yield nodes


def command(
    run_dir: Path, model_dir: Path, data_dir: Path, layout: list[str], address: str | None
) -> list[str]:
    overrides = tiny_run(
        model_dir,
        data_dir / "train.parquet",
        f"data.validation.sets=[{data_dir / 'validation.parquet'}]",
        "data.validation.max_problems=4",
        "data.validation.n=2",
        "trainer.steps=2",
        "trainer.save_every=1",
        *layout,
    )
    cli = [
        sys.executable,
        "-m",
        "or1.cli",
        "train",
        "--recipe",
        RECIPE,
        "--stage",
        "1",
        "--run-dir",
        str(run_dir),
    ]
    cli += [x for o in overrides for x in ("--set", o)]
    return cli + (["--ray-address", address] if address else [])


def test_a_two_node_pool_puts_one_rank_on_each_node(cluster):
    c, worker_node = cluster
    # the workers unpickle WhereAmI from this test module, which imports tests/run_files
    here = Path(__file__).resolve()
    path = os.pathsep.join(str(folder) for folder in (here.parent, here.parents[1]))
    with ray_session(c.address, runtime_env={"env_vars": {"PYTHONPATH": path}}):
        group = WorkerGroup(ResourcePool(2, 1, use_gpu=False), WhereAmI, name="where")
        try:
            (node0, total0), (node1, total1) = group.node()
            assert group.pool.spread
        finally:
            group.shutdown()
        assert {node0, node1} == {c.head_node.node_id, worker_node.node_id}
        assert total0 == total1 == 3.0
        # two "nodes" of 2 CPUs: only the head can host one, so the pool cannot be spread and says what is missing
        with pytest.raises(UserError, match=r"needs 2 node\(s\) with 2 CPU each.*room for 1"):
            ResourcePool(2, 2, use_gpu=False).slots()


def test_tiny_stage_on_two_nodes_equals_one_node(
    cluster, tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    c, _ = cluster
    two_nodes, one_node = tmp_path / "two_nodes", tmp_path / "one_node"
    layouts = {
        two_nodes: (["trainer.nnodes=2", "trainer.devices_per_node=1"], c.address),
        one_node: (["trainer.nnodes=1", "trainer.devices_per_node=2"], None),
    }
    for run_dir, (layout, address) in layouts.items():
        cmd = command(run_dir, tiny_model_dir, tiny_data_dir, layout, address)
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert [m["step"] for m in metrics(two_nodes)] == [0, 1, 2]  # step 0: the validation before training
    assert metrics(two_nodes) == metrics(one_node)
    final = "stage1/final"
    assert_same_weights(weights(two_nodes / final), weights(one_node / final))


def test_a_checkpoint_missing_other_nodes_files_names_shared_storage(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    (tmp_path / "rng_rank0.pt").write_bytes(b"")
    check_visible(tmp_path, ["model/config.json", "rng_rank0.pt"])
    with pytest.raises(
        UserError, match=r"lacks rng_rank1.pt as seen from the controller.*not shared storage"
    ):
        check_visible(tmp_path, ["model/config.json", "rng_rank0.pt", "rng_rank1.pt"])


@pytest.mark.slow
def test_a_lost_worker_node_goes_through_the_restart_path(
    cluster, tmp_path: Path, tiny_model_dir: Path, tiny_data_dir: Path
) -> None:
    """The worker node dies after step 1's checkpoint and a replacement joins: the run restarts its workers from that
    checkpoint on the nodes the cluster has then and finishes. Last in this module: it replaces the worker node."""
    c, worker_node = cluster
    run_dir = tmp_path / "lost_node"
    layout = ["trainer.nnodes=2", "trainer.devices_per_node=1"]
    proc = subprocess.Popen(
        command(run_dir, tiny_model_dir, tiny_data_dir, layout, c.address),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_checkpoint(proc, run_dir, 1, timeout=400)
        c.remove_node(worker_node, allow_graceful=False)  # as a machine that loses power
        c.add_node(num_cpus=WORKER_CPUS)  # its replacement joins
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert "restarting the workers from the latest checkpoint (restart 1 of at most 2)" in out
    assert "resuming stage 1 from" in out
    assert [m["step"] for m in metrics(run_dir)] == [0, 1, 2]
    assert (run_dir / "stage1" / "final" / "model.safetensors").is_file()
