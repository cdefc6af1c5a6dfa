"""CheckpointManager: partial folders never count, the newest complete one wins, old ones are pruned; a checkpoint
holds the worker groups' files and the controller's named parts."""

from __future__ import annotations

from pathlib import Path

import pytest

from or1.errors import UserError
from or1.trainer.checkpoint import CheckpointManager, load_controller_state


def write(manager: CheckpointManager, step: int) -> Path:
    folder = manager.begin(step)
    (folder / "model").mkdir()
    (folder / "model" / "weights").write_text(str(step))
    return manager.commit(folder, step, {"step": step})


def test_partial_checkpoints_are_ignored_and_swept(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    write(manager, 2)
    partial = manager.begin(4)  # a run killed while its workers wrote step 4
    (partial / "model").mkdir()
    (manager.root / "step_6").mkdir()  # a folder without controller state (e.g. copied by hand, half done)
    assert manager.latest() == manager.root / "step_2"
    assert load_controller_state(manager.latest())["step"] == 2
    manager.sweep_partial()
    assert not partial.exists()


def test_newest_wins_and_only_the_last_k_are_kept(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3):
        write(manager, step)
    assert [s for s, _ in manager.complete()] == [2, 3]
    assert (manager.root / "latest").read_text().strip() == "step_3"
    assert (manager.latest() / "model" / "weights").read_text() == "3"


class Counter:
    """A controller part: one number."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


class FakeGroup:
    """A worker group of two ranks that writes what the actor's ranks write into a checkpoint."""

    world_size = 2

    def __init__(self) -> None:
        self.loaded: list[str] = []

    def save_checkpoint(self, path: str) -> None:
        (Path(path) / "model").mkdir()
        (Path(path) / "model" / "config.json").write_text("{}")
        for rank in range(self.world_size):
            (Path(path) / f"rng_rank{rank}.pt").write_bytes(b"")

    def load_checkpoint(self, path: str) -> None:
        self.loaded.append(path)


def test_the_parts_and_the_workers_are_saved_and_loaded_together(tmp_path: Path) -> None:
    group, data, entropy = FakeGroup(), Counter(7), Counter(3)
    manager = CheckpointManager(tmp_path, keep=2, workers=[group], parts={"data": data, "entropy": entropy})
    folder = manager.save(5)
    assert folder == manager.folder(5) == manager.latest()
    assert load_controller_state(folder) == {"step": 5, "data": {"value": 7}, "entropy": {"value": 3}}
    fresh, later = Counter(), Counter(11)  # `later`: a part that checkpoints written before it do not hold
    resumed = CheckpointManager(tmp_path, keep=2, workers=[group], parts={"data": fresh, "later": later})
    assert resumed.load(folder) == 5
    assert (fresh.value, later.value, group.loaded) == (7, 11, [str(folder)])


def test_a_worker_file_missing_from_the_controllers_view_is_refused(tmp_path: Path) -> None:
    class OneRankMissing(FakeGroup):
        def save_checkpoint(self, path: str) -> None:
            super().save_checkpoint(path)
            (Path(path) / "rng_rank1.pt").unlink()  # written on another machine's disk

    with pytest.raises(UserError, match="lacks rng_rank1.pt"):
        CheckpointManager(tmp_path, keep=2, workers=[OneRankMissing()]).save(1)
    assert CheckpointManager(tmp_path, keep=2).latest() is None
