"""`or1 train` in one pass: each stage's config is resolved once, the pre-flight runs once, Ray starts once and the
stop flag is installed once, however many stages the command runs."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

import or1
import or1.hybrid.cluster
import or1.trainer.launch
import or1.trainer.request
import or1.trainer.run
from or1.errors import UserError
from or1.stop import StopFlag
from or1.trainer.launch import launch
from or1.trainer.request import TrainRequest

RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


def fake_inputs(tmp_path: Path) -> tuple[str, ...]:
    """A model folder (the tiny base shipped with or1) and a data file of a batch of prompts the pre-flight accepts."""
    from or1.data.rows import make_row, write_rows

    model = Path(or1.__file__).parent / "tinyworld" / "tiny-base"
    row = make_row(
        data_source="t",
        prompt=[{"role": "user", "content": "Compute 1+1."}],
        ability="math",
        ground_truth=["2"],
        extra_info={"index": 0},
    )
    data = write_rows(tmp_path / "train.parquet", [row] * 24)
    return f"model.path={model}", f"data.train_files=[{data}]"


def counting(monkeypatch: pytest.MonkeyPatch, module: object, name: str, calls: list, result: object = None):
    """Replace module.name by a recorder (result None: call the original and return what it returns)."""
    original = getattr(module, name)

    def record(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs) if result is None else result

    monkeypatch.setattr(module, name, record)


def test_stage_all_resolves_checks_and_starts_ray_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    resolved, checked, sessions, installs, ran = [], [], [], [], []
    counting(monkeypatch, or1.trainer.request, "resolve", resolved)
    counting(monkeypatch, or1.trainer.launch, "check_train", checked)
    counting(monkeypatch, StopFlag, "install", installs)

    @contextmanager
    def ray_session(address, **options):
        sessions.append(address)
        yield

    def run_stages(request, stages, run_dir, console, stop):
        ran.append([cfg.stage.index for cfg in stages])
        return run_dir / "stage3" / "final"

    monkeypatch.setattr(or1.hybrid.cluster, "ray_session", ray_session)
    monkeypatch.setattr(or1.trainer.run, "run_stages", run_stages)
    request = TrainRequest(RECIPE, "all", tmp_path / "run", fake_inputs(tmp_path))
    assert launch(request) == tmp_path / "run" / "stage3" / "final"
    assert [args[1] for args in resolved] == [1, 2, 3]  # each of the recipe's stages once
    assert len(checked) == 1 and sessions == [None] and ran == [[1, 2, 3]]
    assert len(installs) == 2  # watching() installs the handlers, and again after ray.init replaced SIGTERM's


def test_one_stage_by_number_or_name(tmp_path: Path) -> None:
    assert [c.stage.index for c in TrainRequest(RECIPE, "2").stage_configs()] == [2]
    assert [c.stage.index for c in TrainRequest(RECIPE, "3").stage_configs()] == [3]


def test_a_bad_resume_mode_is_refused_before_anything_resolves() -> None:
    with pytest.raises(UserError, match="--resume sometimes: expected auto or never"):
        TrainRequest(RECIPE, "all", resume="sometimes").stage_configs()
