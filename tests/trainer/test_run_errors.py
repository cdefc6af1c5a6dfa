"""`or1 train` mistakes a user can make end as one UserError sentence, before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from or1.data.rows import make_row, write_rows
from or1.errors import UserError
from or1.trainer.launch import launch
from or1.trainer.request import TrainRequest


def run_train(
    recipe: str, stage: str, run_dir: Path, overrides: list[str] | None = None, resume: str = "auto"
) -> Path:
    return launch(TrainRequest(recipe, stage, run_dir, tuple(overrides or ()), resume))


RECIPE = str(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml")


SHIPPED_BASE = Path(__file__).resolve().parents[2] / "src" / "or1" / "tinyworld" / "tiny-base"


def math_rows(count: int) -> list[dict]:
    return [
        make_row(
            data_source="t",
            prompt=[{"role": "user", "content": f"Compute {i}+1."}],
            ability="math",
            ground_truth=[str(i + 1)],
            extra_info={"index": i},
        )
        for i in range(count)
    ]


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
    data = write_rows(tmp_path / "train.parquet", math_rows(30))
    with pytest.raises(UserError, match=r"stage1/final does not exist; run --stage 1 first"):
        run_train(RECIPE, "2", tmp_path / "run", [f"data.train_files=[{data}]"])


def test_bad_resume_mode(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--resume sometimes"):
        run_train(RECIPE, "1", tmp_path / "run", [], resume="sometimes")


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
    data = write_rows(tmp_path / "train.parquet", math_rows(30))
    return [f"model.path={SHIPPED_BASE}", f"data.train_files=[{data}]"]


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


def refused_before_ray(tmp_path: Path, data: Path, *more: str) -> str:
    """`or1 train` on `data` with the shipped tiny base: the UserError it ends with, in under 10 s, Ray never
    started (the refusal used to come after 37 s of Ray and worker start-up)."""
    import time

    import ray

    start = time.monotonic()
    with pytest.raises(UserError) as error:
        run_train(
            RECIPE, "1", tmp_path / "run", [f"model.path={SHIPPED_BASE}", f"data.train_files=[{data}]", *more]
        )
    assert time.monotonic() - start < 10 and not ray.is_initialized()
    return str(error.value)


def test_a_train_file_of_0_rows_is_refused_before_ray_starts(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = tmp_path / "train.parquet"  # what a preparation that kept nothing wrote: no rows, no columns
    pq.write_table(pa.Table.from_pylist([]), empty)
    message = refused_before_ray(tmp_path, empty)
    assert f"0 rows in {empty}" in message and "trainer.batch_size is 24" in message


def test_prompts_all_longer_than_max_prompt_length_are_refused_before_ray_starts(tmp_path: Path) -> None:
    data = write_rows(tmp_path / "train.parquet", math_rows(30))
    message = refused_before_ray(tmp_path, data, "data.max_prompt_length=4")
    assert "only 0 usable prompts" in message and "30 longer than data.max_prompt_length=4" in message
