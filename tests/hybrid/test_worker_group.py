"""Worker groups on a real local Ray: two CPU rank actors, gloo collectives, both dispatch modes, colocation,
and failures (a raising worker, a killed actor) surfacing as WorkerError instead of hangs."""

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import ray
import torch
import torch.distributed as dist

from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.cluster import SOURCE_ROOT, ray_session
from or1.hybrid.dispatch import Dispatch, register
from or1.hybrid.resource_pool import ResourcePool
from or1.hybrid.worker import Worker
from or1.hybrid.worker_group import WorkerError, WorkerGroup, colocate

# Workers cannot import this test module: ship its worker classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

pytestmark = pytest.mark.timeout(120)


class Toy(Worker):
    def __init__(self, offset: int) -> None:
        if offset < 0:
            raise ValueError("offset must be >= 0")
        self.offset = offset
        self.rank_at_init = os.environ["RANK"]  # the group must set the rank env before __init__
        self.set_threads(1)
        self.init_distributed(timeout_s=60)

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self) -> float:
        t = torch.tensor([self.rank + 1.0])
        dist.all_reduce(t)
        return t.item()

    @register(Dispatch.ONE_TO_ALL)
    def env(self, key: str) -> tuple[str, str | None]:
        return self.rank_at_init, os.environ.get(key)

    @register(Dispatch.ONE_TO_ALL)
    def or1_location(self) -> str:
        import or1

        return or1.__file__

    @register(Dispatch.DP_COMPUTE)
    def add_offset(self, batch: Batch, scale: int = 1) -> Batch:
        y = batch["x"] * scale + self.offset
        return Batch(tensors={"y": y, "rank": torch.full((len(batch),), self.rank)}, meta=batch.meta)

    @register(Dispatch.DP_COMPUTE)
    def count_up(self, batch: Batch, fail_at: int = -1):
        """Progress items (this rank's values one by one), then the Batch as the result."""
        for i, x in enumerate(batch["x"].tolist()):
            if i == fail_at and self.rank == 1:
                raise ValueError(f"boom at item {i} on rank {self.rank}")
            yield (self.rank, x)
        yield Batch(tensors={"y": batch["x"] + self.offset})

    @register(Dispatch.DP_COMPUTE)
    def rank_in_meta(self, batch: Batch) -> Batch:
        return Batch(meta={"rank": self.rank})

    @register(Dispatch.ONE_TO_ALL)
    def fail(self, rank: int) -> int:
        if self.rank == rank:
            raise ValueError(f"boom from rank {self.rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def lose_peer(self, dying: int) -> None:
        """Rank `dying` dies a moment after its peers failed (as a collective fails on a peer's lost connection)."""
        if self.rank == dying:
            time.sleep(1.0)
            os._exit(1)
        raise RuntimeError("Read error: Connection reset by peer")

    @register(Dispatch.DP_COMPUTE)
    def lose_peer_streaming(self, batch: Batch, dying: int):
        yield self.rank
        self.lose_peer(dying)

    @register(Dispatch.ONE_TO_ALL)
    def wait_for(self, folder: str) -> int:
        """Block until `touch` marked this rank's file (from the rank's aside thread)."""
        while not (Path(folder) / str(self.rank)).exists():
            time.sleep(0.01)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def touch(self, folder: str) -> int:
        (Path(folder) / str(self.rank)).touch()
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def refuse(self) -> None:
        raise UserError("set toy.offset to a number the toy likes")

    def not_registered(self) -> None:
        pass


class Critic(Worker):
    def __init__(self, bias: float) -> None:
        self.bias = bias
        self.init_distributed()  # the colocated Toy already did: must be a no-op

    @register(Dispatch.DP_COMPUTE)
    def values(self, batch: Batch) -> Batch:
        return Batch(tensors={"values": batch["x"].float() + self.bias})


@pytest.fixture(scope="module", autouse=True)
def session():
    with ray_session(None, num_cpus=2):
        yield


def pool() -> ResourcePool:
    # Half a CPU per rank: two pools of two ranks fit the 2-CPU test cluster at once.
    return ResourcePool(nnodes=1, devices_per_node=2, use_gpu=False, cpus_per_worker=0.5)


@pytest.fixture(scope="module")
def group(session):
    g = WorkerGroup(pool(), Toy, init_kwargs={"offset": 100}, name="toy", env={"OR1_TEST_FLAG": "on"})
    yield g
    g.shutdown()


def test_ranks_get_their_env_before_init_and_gloo_all_reduce_works(group):
    assert group.world_size == 2
    assert group.env("OR1_TEST_FLAG") == [("0", "on"), ("1", "on")]
    assert group.all_reduce_rank() == [3.0, 3.0]
    info = group.worker_info()
    assert [i["rank"] for i in info] == [0, 1] and all(i["distributed"] for i in info)
    assert info[0]["pid"] != info[1]["pid"] and info[0]["device"] == "cpu"


def test_workers_import_or1_from_the_source_tree(group):
    assert all(Path(location).is_relative_to(SOURCE_ROOT) for location in group.or1_location())


def test_dp_compute_splits_pads_and_concatenates(group):
    batch = Batch(tensors={"x": torch.arange(5)}, meta={"step": 7})
    out = group.add_offset(batch, scale=2)
    assert out["y"].tolist() == [100, 102, 104, 106, 108]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1] and out.meta == {"step": 7}


def test_stream_hands_over_items_as_they_come_and_collects_the_last(group):
    seen = []
    out = group.stream(
        Toy.count_up, lambda rank, item: seen.append((rank, item)), Batch(tensors={"x": torch.arange(6)})
    )
    assert out["y"].tolist() == [100, 101, 102, 103, 104, 105]
    assert sorted(seen) == [(0, (0, 0)), (0, (0, 1)), (0, (0, 2)), (1, (1, 3)), (1, (1, 4)), (1, (1, 5))]
    with pytest.raises(
        WorkerError, match=r"rank 1 failed in count_up\(\): ValueError: boom at item 1 on rank 1"
    ):
        group.stream(Toy.count_up, lambda rank, item: None, Batch(tensors={"x": torch.arange(6)}), fail_at=1)
    with pytest.raises(AttributeError, match="not a method of Toy"):  # methods, not names, and of its class
        group.stream(Worker.__init__, lambda rank, item: None)


def test_an_aside_call_runs_beside_the_call_in_progress(group, tmp_path):
    """`aside` runs in each rank's second thread: here it releases a call that waits for it (in the rank's own
    thread it would wait behind that call for ever)."""
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(group.wait_for, str(tmp_path))
        assert group.aside("touch", str(tmp_path)).result() == [0, 1]
        assert waiting.result(timeout=30) == [0, 1]
    with pytest.raises(AttributeError, match="not a registered ONE_TO_ALL"):
        group.aside("add_offset", Batch(tensors={"x": torch.arange(2)}))


def test_only_registered_methods_are_callable(group):
    with pytest.raises(AttributeError, match="not marked @register"):
        _ = group.not_registered
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        _ = group.nope


def test_worker_exception_names_group_rank_method_and_remote_error(group):
    with pytest.raises(
        WorkerError, match=r"worker group 'toy' rank 1 failed in fail\(\): ValueError: boom from rank 1"
    ):
        group.fail(1)
    assert group.fail(5) == [0, 1]  # the group stays usable after a method raised


def test_a_workers_user_error_stays_one_user_error_line(group):
    with pytest.raises(
        UserError, match=r"^set toy.offset .* likes \(worker group 'toy' rank \d, refuse\(\)\)$"
    ):
        group.refuse()


def test_disagreeing_rank_results_name_the_group_and_method(group):
    with pytest.raises(
        ValueError, match=r"'toy': cannot collect the results of rank_in_meta\(\): Batch meta 'rank'"
    ):
        group.rank_in_meta(Batch(tensors={"x": torch.arange(2)}))


def test_failing_constructor_raises_and_releases_the_pool(group):
    free = ray.available_resources()["CPU"]
    p = ResourcePool(nnodes=1, devices_per_node=1, use_gpu=False, cpus_per_worker=0.5)
    with pytest.raises(
        WorkerError, match=r"worker group 'bad' rank 0 failed in __init__\(\): ValueError: offset must be"
    ):
        WorkerGroup(p, Toy, init_kwargs={"offset": -1}, name="bad")
    assert p.owner is None
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU", 0) < free and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == free


def test_a_pool_hosts_one_group(group):
    with pytest.raises(ValueError, match="already hosts worker group 'toy'"):
        WorkerGroup(group.pool, Critic, init_kwargs={"bias": 0.0}, name="second")


def test_colocated_roles_share_one_process_per_rank(group):
    roles = colocate(
        pool(), {"actor": (Toy, {"offset": 1}), "critic": (Critic, {"bias": 0.5})}, name="hybrid"
    )
    try:
        actor, critic = roles["actor"], roles["critic"]
        assert [i["pid"] for i in actor.worker_info()] == [i["pid"] for i in critic.worker_info()]
        assert actor.all_reduce_rank() == [3.0, 3.0]
        batch = Batch(tensors={"x": torch.arange(4)})
        assert critic.values(batch)["values"].tolist() == [0.5, 1.5, 2.5, 3.5]
        assert actor.add_offset(batch)["y"].tolist() == [1, 2, 3, 4]
        with pytest.raises(WorkerError, match="worker group 'hybrid/actor' rank 0 failed in fail"):
            actor.fail(0)
    finally:
        actor.shutdown()
    with pytest.raises(RuntimeError, match="was shut down"):
        critic.worker_info()


def test_killed_actor_raises_instead_of_hanging(group):
    doomed = WorkerGroup(pool(), Toy, init_kwargs={"offset": 0}, name="doomed")
    try:
        pid = doomed.worker_info()[1]["pid"]
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        # Rank 0 blocks in all_reduce waiting for the dead peer; the controller must still return promptly.
        with pytest.raises(WorkerError, match="worker group 'doomed' rank 1 failed in all_reduce_rank.*died"):
            doomed.all_reduce_rank()
        assert time.monotonic() - start < 30
    finally:
        doomed.shutdown()


@pytest.mark.parametrize("streamed", [False, True], ids=["call", "stream"])
def test_a_peer_seen_dead_after_its_rank_failed_is_named_as_the_cause(group, streamed):
    doomed = WorkerGroup(pool(), Toy, init_kwargs={"offset": 0}, name="doomed")
    try:
        with pytest.raises(WorkerError, match="rank 1 failed in lose_peer.*died.*rank 0 then failed") as err:
            if streamed:
                doomed.stream(
                    Toy.lose_peer_streaming, lambda rank, item: None, Batch(tensors={"x": torch.arange(2)}), 1
                )
            else:
                doomed.lose_peer(1)
        assert err.value.died  # the failure a restart answers
    finally:
        doomed.shutdown()


def test_missing_resources_are_named(group):
    with pytest.raises(UserError, match="missing: the largest node lacks 1 GPU"):
        ResourcePool(nnodes=1, devices_per_node=1, use_gpu=True).slots()
    with pytest.raises(
        UserError, match=r"needs 3 node\(s\) with 1 CPU each.*room for 2; missing: room for 1 more"
    ):
        ResourcePool(nnodes=3, devices_per_node=1, use_gpu=False).slots()
    with pytest.raises(UserError, match="missing: the largest node lacks 6 CPU"):
        ResourcePool(nnodes=1, devices_per_node=8, use_gpu=False).slots()
    # One machine with room for two "nodes" hosts both placement groups.
    ResourcePool(nnodes=2, devices_per_node=1, use_gpu=False, cpus_per_worker=0.5).check_cluster()


JOIN_SCRIPT = """
import ray, sys
from or1.hybrid.cluster import SOURCE_ROOT, ray_session
with ray_session(sys.argv[1]):
    print("cpus", ray.cluster_resources()["CPU"])
"""


def test_ray_session_joins_a_cluster_and_leaves_it_running(group):
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-c", JOIN_SCRIPT, address],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=Path(__file__).parent,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cpus 2.0" in out.stdout
    assert group.all_reduce_rank() == [3.0, 3.0]  # the joined cluster and its actors are still up
