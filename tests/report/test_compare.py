"""`or1 report A B`: two evaluations compared, or refused as incomparable with the settings that differ named."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from typer.testing import CliRunner

from or1.cli import app
from or1.report.compare import compare, provenance
from or1.report.markdown import eval_gains
from or1.report.runfiles import read_run

SUMMARY = {
    "benchmark": "aime24",
    "engine": "vllm",
    "engine_build": {
        "name": "vllm",
        "version": "vllm 0.32.0, torch 2.13.0",
        "dtype": "bfloat16",
        "tensor_parallel_size": 1,
    },
    "model": {"path": "/models/a", "sha256": "a" * 64},
    "data": {"source": "aime24.parquet", "sha256": "d" * 64, "num_problems": 30},
    "sampling": {
        "protocol": "skywork",
        "n": 32,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 32768,
        "seed": 0,
    },
    "seed": 0,
    "seeding": "per sample",
    "environment": {"vllm": "0.32.0", "torch": "2.13.0"},
    "metrics": {"estimates": {"avg@32": {"value": 0.4, "ci_low": 0.35, "ci_high": 0.45}}},
}


def changed(**edits: object) -> dict:
    summary = copy.deepcopy(SUMMARY)
    for path, value in edits.items():
        *parents, key = path.split("__")
        node = summary
        for parent in parents:
            node = node[parent]
        node[key] = value
    return summary


def write(folder: Path, summary: dict) -> Path:
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    return folder


def test_engine_version_or_sampling_make_two_results_incomparable() -> None:
    newer = compare(SUMMARY, changed(engine_build__version="vllm 0.33.0, torch 2.13.0"))
    assert not newer.comparable
    assert "engine_version: vllm 0.32.0, torch 2.13.0 vs vllm 0.33.0, torch 2.13.0" in newer.describe()
    hotter = compare(SUMMARY, changed(sampling__temperature=0.6, sampling__top_p=0.95))
    assert [(d.key, d.a, d.b) for d in hotter.differences] == [
        ("temperature", 1.0, 0.6),
        ("top_p", 1.0, 0.95),
    ]
    assert not hotter.comparable
    # another model (what one compares), seed or tensor parallelism: comparable, the differences listed
    other = compare(SUMMARY, changed(model__sha256="b" * 64, seed=1, engine_build__tensor_parallel_size=2))
    assert other.comparable and [d.key for d in other.differences] == [
        "tensor_parallel_size",
        "seed",
        "model_sha256",
    ]
    assert (
        "also different: tensor_parallel_size: 1 vs 2; seed: 0 vs 1; model_sha256: aaaaaaaaaaaa vs bbbbbbbbbbbb"
        in (other.describe())
    )


def test_a_summary_from_before_engine_build_reads_the_version_it_recorded() -> None:
    old = changed()
    del old["engine_build"]
    assert provenance(old)["engine_version"] == "vllm 0.32.0, torch 2.13.0"
    assert provenance(old)["dtype"] is None
    assert [d.key for d in compare(old, SUMMARY).differences] == ["dtype", "tensor_parallel_size"]


def test_or1_report_compares_two_evaluations(tmp_path: Path) -> None:
    a = write(tmp_path / "a", SUMMARY)
    same = write(tmp_path / "b", changed(model__sha256="b" * 64))
    newer = write(tmp_path / "c", changed(engine_build__version="vllm 0.33.0, torch 2.13.0", sampling__n=4))
    runner = CliRunner()
    ok = runner.invoke(app, ["report", str(a), str(same / "summary.json")])
    assert ok.exit_code == 0, ok.output
    assert (
        ok.output.startswith("comparable") and "avg@32: 40.0 [35.0, 45.0] vs 40.0 [35.0, 45.0]" in ok.output
    )
    refused = runner.invoke(app, ["report", str(a), str(newer)])
    assert refused.exit_code == 1
    assert "INCOMPARABLE, they differ in n: 32 vs 4; engine_version: vllm 0.32.0" in refused.output
    missing = runner.invoke(app, ["report", str(a), str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "holds no summary.json" in missing.output


def test_the_run_report_flags_a_base_and_final_evaluated_differently(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "tiny"
    write(run / "eval" / "base", SUMMARY)
    write(run / "eval" / "final", changed(sampling__temperature=0.6, model__sha256="b" * 64))
    (line,) = eval_gains(read_run(run))
    assert line.startswith("aime24, base -> final: avg@32 40.0% -> 40.0%")
    assert line.endswith(
        "(INCOMPARABLE, they differ in temperature: 1.0 vs 0.6. also different: model_sha256: aaaaaaaaaaaa vs bbbbbbbbbbbb)"
    )
