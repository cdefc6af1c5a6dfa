"""Hard limits hold off the main thread: from a thread, a threaded Ray actor and a plain subprocess."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from or1.rewards.score import score_batch

SLOW = "\\boxed{\\sum_{k=1}^{10^{9}} k^{k}}"  # sympy would run for minutes: only the pool's kill stops it


def _rows() -> list[dict]:
    gt = {"ground_truth": json.dumps(["42"])}
    return [
        {"ability": "math", "response": r, "reward_model": gt}
        for r in ("\\boxed{\\frac{84}{2}}", SLOW, "\\boxed{41}")
    ]


EXPECTED = ["correct", "timeout", "wrong_answer"]


def test_from_another_thread() -> None:
    out: list = []
    worker = threading.Thread(target=lambda: out.append(score_batch(_rows(), timeout=2.0)))
    worker.start()
    worker.join(120)
    assert [r.reason for r in out[0]] == EXPECTED


def test_from_a_subprocess(tmp_path: Path) -> None:
    script = (
        "import json, sys\n"
        "from or1.rewards.score import score_batch\n"
        "if __name__ == '__main__':\n"
        "    rows = json.loads(sys.stdin.read())\n"
        "    print(json.dumps([r.reason for r in score_batch(rows, timeout=2.0)]))\n"
    )
    (tmp_path / "child.py").write_text(script)
    src = str(Path(__import__("or1").__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, str(tmp_path / "child.py")],
        input=json.dumps(_rows()),
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == EXPECTED


@pytest.fixture(scope="module")
def ray_session() -> Iterator[object]:
    ray = pytest.importorskip("ray")
    src = str(Path(__import__("or1").__file__).resolve().parents[1])
    ray.init(
        address="local",  # a cluster of its own, never one another process left running
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": src}},
        log_to_driver=False,
    )
    yield ray
    ray.shutdown()


def test_from_a_threaded_ray_actor(ray_session: object) -> None:
    ray = ray_session

    @ray.remote(max_concurrency=2)
    class Scorer:
        def score(self, rows: list[dict]) -> list[str]:
            return [r.reason for r in score_batch(rows, timeout=2.0)]

    scorer = Scorer.remote()
    started = time.monotonic()
    both = ray.get([scorer.score.remote(_rows()), scorer.score.remote(_rows())], timeout=180)
    assert both == [EXPECTED, EXPECTED]
    assert time.monotonic() - started < 120


@pytest.mark.slow  # a second actor and pool start-up; the threaded actor above covers the default run
def test_from_an_async_ray_actor(ray_session: object) -> None:
    ray = ray_session

    @ray.remote
    class AsyncScorer:
        async def score(self, rows: list[dict]) -> list[str]:
            import asyncio

            loop = (
                asyncio.get_running_loop()
            )  # a blocking call belongs in an executor thread, off the event loop
            results = await loop.run_in_executor(None, lambda: score_batch(rows, timeout=2.0))
            return [r.reason for r in results]

    scorer = AsyncScorer.remote()
    assert ray.get(scorer.score.remote(_rows()), timeout=180) == EXPECTED
