"""`or1 train` mistakes a user can make end as one UserError sentence, before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from or1.errors import UserError
from or1.trainer.launch import launch
from or1.trainer.request import TrainRequest


def run_train(
    recipe: str, stage: str, run_dir: Path, overrides: list[str] | None = None, resume: str = "auto"
) -> Path:
    return launch(TrainRequest(recipe, stage, run_dir, tuple(overrides or ()), resume))


RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


def test_missing_model_folder(tmp_path: Path) -> None:
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    with pytest.raises(UserError, match=r"model.path: .*nowhere is not a model folder.*or1 init-model"):
        run_train(
            RECIPE,
            "1",
            tmp_path / "run",
            [f"model.path={tmp_path / 'nowhere'}", f"data.train_files=[{data}]"],
        )


def test_missing_data_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"data.train_files: .*absent.parquet is not a file"):
        run_train(RECIPE, "1", tmp_path / "run", [f"data.train_files=[{tmp_path / 'absent.parquet'}]"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_recipe_on_a_cpu_machine(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="needs CUDA GPUs"):
        run_train("or1-math-7b", "1", tmp_path / "run")
    with pytest.raises(UserError, match="needs CUDA GPUs"):
        run_train(RECIPE, "1", tmp_path / "run", ["trainer.device=cuda"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a driver without CUDA")
def test_a_gpu_recipe_may_join_a_cluster_whose_gpus_are_on_other_machines(tmp_path: Path) -> None:
    from or1.config.recipe import resolve
    from or1.preflight import check_runnable

    cfg = resolve("tiny-gpu", 1, [f"data.train_files=[{tmp_path / 'absent.parquet'}]"])
    with pytest.raises(UserError, match="needs CUDA GPUs"):
        check_runnable(cfg, tmp_path)
    # joining a cluster: no local CUDA check (the resource pool asks the cluster for GPUs); the next check speaks
    with pytest.raises(UserError, match=r"data.train_files: .*absent.parquet is not a file"):
        check_runnable(cfg, tmp_path, ray_address="auto")


def test_vllm_engine_needs_a_usable_vllm_build(monkeypatch: pytest.MonkeyPatch) -> None:
    from or1 import preflight
    from or1.preflight import check_vllm_usable

    monkeypatch.setattr(preflight, "installed_build", lambda: None)
    with pytest.raises(UserError, match=r"needs vLLM .*or pass --set rollout.engine=hf"):
        check_vllm_usable(on_cpu=True)
    monkeypatch.setattr(preflight, "installed_build", lambda: ("vllm", "0.32.1"))
    with pytest.raises(UserError, match="is a GPU build and this run is on CPU"):
        check_vllm_usable(on_cpu=True)
    check_vllm_usable(on_cpu=False)
    monkeypatch.setattr(preflight, "installed_build", lambda: ("vllm", "0.8.5"))
    with pytest.raises(
        UserError, match=r"vLLM 0.8.5 is outside the range or1 supports \(0.32 <= version < 0.34\)"
    ):
        check_vllm_usable(on_cpu=False)


def test_stage_two_needs_stage_one(tmp_path: Path) -> None:
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    with pytest.raises(UserError, match=r"stage1/final does not exist; run --stage 1 first"):
        run_train(RECIPE, "2", tmp_path / "run", [f"data.train_files=[{data}]"])


def test_bad_resume_mode(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--resume sometimes"):
        run_train(RECIPE, "1", tmp_path / "run", [], resume="sometimes")


def fake_model(folder: Path) -> Path:
    """Enough of a model folder for the pre-flight checks (they read files only)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "qwen2"}')
    (folder / "model.safetensors").write_bytes(b"")
    (folder / "tokenizer.json").write_text("{}")
    return folder


def finished_stage(tmp_path: Path, overrides: list[str]) -> Path:
    """A run folder whose stage 1 holds results (config.yaml as run_train writes it, metrics, a final model)."""
    from or1.config.recipe import dump, resolve

    run_dir = tmp_path / "run"
    stage = run_dir / "stage1"
    (stage / "final").mkdir(parents=True)
    cfg = resolve(RECIPE, "1", overrides)
    (stage / "config.yaml").write_text(dump(cfg))
    (stage / "metrics.jsonl").write_text('{"step": 1}\n')
    (stage / "summary.json").write_text("{}\n")
    return run_dir


@pytest.fixture
def inputs(tmp_path: Path) -> list[str]:
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    return [f"model.path={fake_model(tmp_path / 'model')}", f"data.train_files=[{data}]"]


def test_resume_never_refuses_to_delete_a_stage_with_results(tmp_path: Path, inputs: list[str]) -> None:
    run_dir = finished_stage(tmp_path, inputs)
    before = sorted(p.name for p in (run_dir / "stage1").iterdir())
    with pytest.raises(UserError, match=r"--resume never: .*stage1 already holds results.*--overwrite"):
        run_train(RECIPE, "1", run_dir, inputs, resume="never")
    assert sorted(p.name for p in (run_dir / "stage1").iterdir()) == before  # nothing deleted


def test_resume_under_a_changed_config_lists_the_differences(tmp_path: Path, inputs: list[str]) -> None:
    run_dir = finished_stage(tmp_path, inputs)
    changed = [*inputs, "actor.lr=3e-5", "rollout.max_response_length=64"]
    with pytest.raises(UserError) as err:
        run_train(RECIPE, "1", run_dir, changed, resume="auto")
    message = str(err.value)
    assert "actor.lr: 5e-05 -> 3e-05" in message
    assert "rollout.max_response_length: 48 -> 64" in message
    assert "--allow-config-change" in message
    # how the run is operated (loggers, checkpoints kept) may change on a resume
    from or1.config.recipe import resolve
    from or1.trainer.resume import check_config_unchanged

    cfg = resolve(RECIPE, "1", [*inputs, "trainer.loggers=[jsonl]", "trainer.keep_checkpoints=7"])
    check_config_unchanged(cfg, run_dir / "stage1", False, None)  # type: ignore[arg-type]
