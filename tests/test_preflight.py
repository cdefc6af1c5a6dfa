"""Pre-flight mistakes through the real `or1` command: each is one `error:` line and exit code 2, before any model or
Ray starts. The time bound is a generous upper limit (the issue's "within a few seconds" versus the minutes these
mistakes cost before), not a timing measurement."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

RECIPE = str(Path(__file__).resolve().parents[1] / "stages" / "tiny.yaml")
BOUND_S = 20.0
ENV = {**os.environ, "COLUMNS": "1000"}


def or1(*args: str) -> subprocess.CompletedProcess:
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "or1.cli", *args], capture_output=True, text=True, timeout=120, env=ENV
    )
    assert time.monotonic() - start < BOUND_S, f"or1 {' '.join(args)} took over {BOUND_S} s"
    return done


def assert_one_error(done: subprocess.CompletedProcess, *needles: str) -> str:
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.parquet"
    path.write_bytes(b"")  # check_runnable only checks that it exists
    return path


def train(model: Path, data: Path, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    sets = [f"model.path={model}", f"data.train_files=[{data}]"]
    return or1(
        "train",
        "--recipe",
        RECIPE,
        "--run-dir",
        str(run_dir),
        *[a for s in sets for a in ("--set", s)],
        *extra,
    )


@pytest.mark.parametrize("config", [None, "{}", '{"hidden_size": 8}'])
def test_a_folder_that_is_not_a_model(tmp_path: Path, data_file: Path, config: str | None) -> None:
    model = tmp_path / "model"
    model.mkdir()
    if config is not None:
        (model / "config.json").write_text(config)
    done = train(model, data_file, tmp_path / "run")
    assert_one_error(done, f"model.path: {model}", "not a model folder", "or1 init-model")


def test_a_missing_model(tmp_path: Path, data_file: Path) -> None:
    assert_one_error(train(tmp_path / "nowhere", data_file, tmp_path / "run"), "does not exist")


def test_a_model_without_weights_or_tokenizer(tmp_path: Path, data_file: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert_one_error(train(model, data_file, tmp_path / "run"), "has no weights")
    (model / "model.safetensors").write_bytes(b"")
    assert_one_error(train(model, data_file, tmp_path / "run"), "has no tokenizer")


def test_a_bad_stage_number(tmp_path: Path) -> None:
    assert_one_error(or1("train", "--recipe", RECIPE, "--stage", "9"), "stage 9 is out of range")


def test_a_dead_ray_address(tmp_path: Path, data_file: Path) -> None:
    # 127.0.0.1:9 refuses at once
    done = train(tmp_path / "m", data_file, tmp_path / "run", "--ray-address", "127.0.0.1:9")
    assert_one_error(done, "--ray-address 127.0.0.1:9: nothing answers")


def test_a_ray_address_that_accepts_but_never_answers(tmp_path: Path, data_file: Path) -> None:
    """What hung `or1 train` for minutes before: a port that accepts the connection and then stays silent."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        address = f"127.0.0.1:{server.getsockname()[1]}"
        done = train(tmp_path / "m", data_file, tmp_path / "run", "--ray-address", address)
    assert_one_error(done, f"--ray-address {address}: ", "does not answer as a Ray cluster")


def test_ray_address_auto_without_a_cluster(tmp_path: Path, data_file: Path, monkeypatch) -> None:
    if os.environ.get("RAY_ADDRESS") or Path("/tmp/ray/ray_current_cluster").exists():
        pytest.skip("a Ray cluster is recorded on this machine")
    done = train(tmp_path / "m", data_file, tmp_path / "run", "--ray-address", "auto")
    assert_one_error(done, "no running Ray cluster found")


def test_the_wandb_logger_without_wandb(tmp_path: Path, data_file: Path) -> None:
    pytest.importorskip  # noqa: B018 - documents intent: the check only makes sense where wandb is absent
    try:
        import wandb  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("wandb is installed here")
    done = train(tmp_path / "m", data_file, tmp_path / "run", "--set", "trainer.loggers=[jsonl,wandb]")
    # the brackets of the extra survive the console's markup
    assert_one_error(done, "pip install 'or1[wandb]'")


def test_out_paths_that_are_files(tmp_path: Path, data_file: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_one_error(or1("init-model", "--out", str(a_file)), f"--out {a_file} is a file")
    assert_one_error(or1("prepare-data", "--out", str(a_file)), f"--out {a_file} is a file")
    assert_one_error(train(tmp_path / "m", data_file, a_file), f"--run-dir {a_file} is a file")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    assert_one_error(or1("score", str(rows), "--out", str(a_file / "out.jsonl")), f"{a_file} is a file")
    assert_one_error(or1("eval", str(rows), "--model", str(tmp_path / "nowhere")), "does not exist")
    assert a_file.read_text() == "x"


def test_prepare_data_does_not_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "data"
    out.mkdir()
    (out / "train.parquet").write_bytes(b"mine")
    assert_one_error(or1("prepare-data", "--out", str(out)), "already exist", "--overwrite")
    assert (out / "train.parquet").read_bytes() == b"mine"


def test_version() -> None:
    done = or1("--version")
    assert done.returncode == 0 and done.stdout.startswith("or1 ")
