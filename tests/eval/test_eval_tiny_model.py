"""End to end on the tiny model: real HF sampling and real rewards on the shared AIME and LiveCodeBench files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.data.benchmarks import benchmark_folder, file_sha256
from or1.eval import evaluate
from or1.eval.evaluate import run_eval
from or1.eval.results import model_fingerprint

BENCHMARKS = benchmark_folder()

pytestmark = pytest.mark.skipif(
    BENCHMARKS is None or not BENCHMARKS.is_dir(),
    reason="no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)",
)


def lines(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]


def test_aime24_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    data = BENCHMARKS / "aime24" / "aime24.parquet"
    out = run_eval(
        "aime24",
        model=tiny_model_dir,
        n=2,
        data=data,
        max_tokens=16,
        max_problems=2,
        out=tmp_path / "a",
        workers=1,
        show_progress=False,
    )
    header, *samples = lines(out)
    assert header["header"]["model_sha256"] == model_fingerprint(tiny_model_dir)["sha256"]
    assert len(samples) == 4 and all(s["num_tokens"] <= 16 and s["reason"] for s in samples)
    assert all(not s["truncated"] for s in samples if s["num_tokens"] < 16)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["sha256"] == file_sha256(data)
    assert summary["sampling"]["temperature"] == 1.0 and summary["sampling"]["max_tokens"] == 16
    assert set(summary["metrics"]["estimates"]) == {"avg@2", "pass@1", "pass@2", "first@1", "maj@2"}
    assert "| avg@2 |" in (out / "report.md").read_text()


def test_livecodebench_on_the_tiny_model_resumes_after_a_kill(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = evaluate.load_sampler
    calls: list[int] = []

    def dying(*args):  # the real sampler, killed on its second batch
        sample = real(*args)

        def wrapped(prompts, seeds):
            calls.append(len(prompts))
            if len(calls) == 2:
                raise KeyboardInterrupt
            return sample(prompts, seeds)

        return wrapped

    monkeypatch.setattr(evaluate, "load_sampler", dying)
    kwargs = {
        "model": tiny_model_dir,
        "n": 3,
        "max_tokens": 8,
        "max_problems": 1,
        "out": tmp_path / "lcb",
        "batch_size": 1,
        "workers": 1,
        "show_progress": False,
    }
    with pytest.raises(KeyboardInterrupt):
        run_eval("livecodebench", **kwargs)
    before = lines(tmp_path / "lcb")[1:]
    assert len(before) == 1
    monkeypatch.setattr(evaluate, "load_sampler", real)
    out = run_eval("livecodebench", **kwargs)
    after = lines(out)[1:]
    assert after[:1] == before and len(after) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samples_reused"] == 1 and summary["data"]["date_filter"].startswith("not applied")
    assert "maj@3" not in summary["metrics"]["estimates"]
    assert (out / "report.md").is_file()
