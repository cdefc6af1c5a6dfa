"""CheckpointManager: partial folders never count, the newest complete one wins, old ones are pruned."""

from __future__ import annotations

from pathlib import Path

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
