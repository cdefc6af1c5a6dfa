"""`or1 train` mistakes a user can make end as one UserError sentence, before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from or1.errors import UserError
from or1.trainer.run import run_train

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
def test_gpu_recipe_on_a_cpu_machine(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="rollout.engine=vllm, which needs a GPU"):
        run_train("or1-math-7b", "1", tmp_path / "run")
    with pytest.raises(UserError, match="needs CUDA GPUs"):
        run_train(RECIPE, "1", tmp_path / "run", ["trainer.device=cuda"])


def test_stage_two_needs_stage_one(tmp_path: Path) -> None:
    data = tmp_path / "train.parquet"
    data.write_bytes(b"")
    with pytest.raises(UserError, match=r"stage1/final does not exist; run --stage 1 first"):
        run_train(RECIPE, "2", tmp_path / "run", [f"data.train_files=[{data}]"])


def test_bad_resume_mode(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="--resume sometimes"):
        run_train(RECIPE, "1", tmp_path / "run", [], resume="sometimes")
