"""Shared fixtures: one tiny world per test run, built in pytest's tmp dirs (nothing cached elsewhere)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# One intra-op thread: the tiny model gains little from a second one, and on a shared 2-core machine spinning OpenMP
# threads slowed the engine tests tenfold when other processes held the cores.
torch.set_num_threads(1)

# The shared benchmark files beside this checkout, when it has them: tests find them through the OR1_BENCHMARKS
# setting (or1.data.benchmarks), as a user's own folder would be found; without them those tests skip.
SHARED_BENCHMARKS = Path(__file__).resolve().parents[2] / "shared" / "benchmarks"
if SHARED_BENCHMARKS.is_dir():
    os.environ.setdefault("OR1_BENCHMARKS", str(SHARED_BENCHMARKS))

# OR1_TEST_SEED (default 0) seeds the tiny world the tests train and sample: the session fixtures' tiny model (its
# tokenizer corpus, initial weights and warm start) and tiny dataset, and the engine tests' untrained model
# (tests/engines/conftest.py). Seed 0 builds exactly what the suite always built. Other seeds give other trained
# models and other data, the way another CPU's kernels (ATEN_CPU_CAPABILITY) give another trajectory: a test that
# passes only for one seed depends on one trajectory. Measure a test's spread with e.g.
#   for s in 0 1 2; do OR1_TEST_SEED=$s ATEN_CPU_CAPABILITY=avx2 pytest tests/models; done
TEST_SEED = int(os.environ.get("OR1_TEST_SEED", "0"))


def pytest_report_header() -> str:
    """torch's CPU kernel choice: the tiny runs' numbers follow it (ATEN_CPU_CAPABILITY forces one)."""
    forced = os.environ.get("ATEN_CPU_CAPABILITY")
    return (
        f"torch {torch.__version__}, CPU kernels {torch.backends.cpu.get_cpu_capability()}"
        + (f" (forced by ATEN_CPU_CAPABILITY={forced})" if forced else "")
        + f", OR1_TEST_SEED={TEST_SEED}"
    )


# A shorter warm start than the preset's keeps the session setup near 40 s; it still solves some 3-4 operand tasks.
TEST_SFT_STEPS = 120
BUILD_TINY_MODEL = (
    "import sys; from pathlib import Path; from or1.tinyworld.init import init_tiny_model; "
    "init_tiny_model(Path(sys.argv[1]), seed=int(sys.argv[2]), sft_steps=int(sys.argv[3]), eval_samples=2)"
)
_tiny_model: dict = {}  # the background build: its process and folder


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building the session's tiny model as soon as collection shows a test that needs it: the warm start runs
    on one thread, so it takes the second core while the tests before the first such test run (about 90 s of a
    2-core CI run, then spent waiting)."""
    if any("tiny_model_dir" in getattr(item, "fixturenames", ()) for item in session.items):
        start_tiny_model_build()


def start_tiny_model_build() -> None:
    folder = Path(tempfile.mkdtemp(prefix="or1-test-tiny-model-"))
    cmd = [sys.executable, "-c", BUILD_TINY_MODEL, str(folder / "model"), str(TEST_SEED), str(TEST_SFT_STEPS)]
    with (folder / "build.log").open("w") as log:
        _tiny_model.update(folder=folder, proc=subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))


def pytest_sessionfinish(session: pytest.Session) -> None:
    if proc := _tiny_model.get("proc"):
        proc.kill()  # a run stopped early (-x, Ctrl-C) leaves no build behind; a finished one is gone already
        proc.wait()
        shutil.rmtree(_tiny_model["folder"], ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A tiny base model folder built once per test run, in the background from collection on (its init report is
    in or1_init_report.json)."""
    # a test may ask for it where collection did not see it (request.getfixturevalue): build it now
    if "proc" not in _tiny_model:
        start_tiny_model_build()
    folder, proc = _tiny_model["folder"], _tiny_model["proc"]
    if proc.wait() != 0:
        pytest.fail(f"building the tiny model failed:\n{(folder / 'build.log').read_text()[-3000:]}")
    return folder / "model"


@pytest.fixture(scope="session")
def tiny_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny dataset (math and code, train and validation parquet files), written once per test run."""
    from or1.data.synthetic import write_tiny_dataset

    out = tmp_path_factory.mktemp("tiny_data")
    write_tiny_dataset(out, seed=TEST_SEED, math_train_size=400, code_train_size=50)
    return out
