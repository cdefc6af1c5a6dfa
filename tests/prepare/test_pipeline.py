"""`or1 prepare-data --spec`: the report adds up, every dropped row is traceable, tiny reproduces the synthetic
files, and a spec over the evaluation sets, decontaminated against themselves, keeps nothing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from or1.cli import app
from or1.data.benchmarks import benchmark_folder
from or1.data.records import read_records
from or1.prepare.pipeline import prepare
from or1.prepare.spec import load_spec

BENCHMARKS = benchmark_folder()

SOLUTION = "Adding gives $\\boxed{{{}}}$."


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def write_spec(path: Path, spec: dict) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture
def messy(tmp_path: Path) -> Path:
    """A DeepScaleR-style file with one row of each fate, and a TACO-style file with some of its own."""
    math = [
        {"problem": "What is 12 plus 30?", "answer": "42", "solution": SOLUTION.format(42)},  # kept
        {"problem": "What is  12 plus 30?", "answer": "42"},  # exact duplicate of row 0 (spacing)
        "{not json",  # malformed line
        {"problem": "Prove that 2 is prime.", "answer": "proof"},  # no answer (a proof)
        {"problem": "Prove that 3 is prime.", "answer": "3"},  # proof
        {"problem": "What is 2 plus 2? (A) 3 (B) 4", "answer": "B"},  # multiple choice
        {"problem": "What is 7 plus 8?", "answer": "16", "solution": SOLUTION.format(15)},  # answer mismatch
        {"answer": "5"},  # malformed: no problem text
        {
            "problem": "Every morning Aya goes for a 9-kilometer-long walk and stops at a coffee shop afterwards.",
            "answer": "204",
        },  # contaminated by the eval file below
        {"problem": "What is 100 minus 58?", "answer": "42"},  # kept
    ]
    lines = [r if isinstance(r, str) else json.dumps(r) for r in math]
    write_jsonl(tmp_path / "deepscaler.jsonl", lines)
    taco = [
        {
            "question": "Print the sum of a and b.",
            "input_output": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]}),
        },
        {
            "question": "Print nothing useful.",
            "input_output": json.dumps({"inputs": [], "outputs": []}),
        },  # no tests
    ]
    write_jsonl(tmp_path / "taco.jsonl", [json.dumps(r) for r in taco])
    evals = [{"problem": math[8]["problem"] + " Find s.", "answer": "204"}]
    write_jsonl(tmp_path / "eval.jsonl", [json.dumps(r) for r in evals])
    return write_spec(
        tmp_path / "messy.yaml",
        {
            "name": "messy",
            "sources": [
                {"name": "deepscaler", "path": str(tmp_path / "deepscaler.jsonl"), "adapter": "deepscaler"},
                {"name": "taco", "path": str(tmp_path / "taco.jsonl")},
            ],
            "dedup": {"near": True, "threshold": 0.9},
            "decontaminate": {"benchmarks": [], "files": [str(tmp_path / "eval.jsonl")], "ngram": 8},
            "checks": {"code_solution": False, "workers": 1},
        },
    )


def test_report_adds_up_and_every_drop_is_traceable(messy: Path, tmp_path: Path):
    out = tmp_path / "out"
    prepared = prepare(messy, out)
    report = json.loads((out / "report.json").read_text())
    assert report["sources"]["deepscaler"] == {
        "in": 10,
        "kept": 2,
        "dropped": {
            "malformed": 2,
            "no_answer": 1,
            "proof": 1,
            "multiple_choice": 1,
            "duplicate": 1,
            "contaminated": 1,
            "answer_mismatch": 1,
        },
    }
    assert report["sources"]["taco"] == {"in": 2, "kept": 1, "dropped": {"no_tests": 1}}
    for step in report["steps"]:  # per step and source: in = kept + drops, and kept feeds the next step
        for counts in step["sources"].values():
            assert counts["in"] == counts["kept"] + sum(counts["dropped"].values())
    for before, after in zip(report["steps"], report["steps"][1:], strict=False):
        assert {s: c["kept"] for s, c in before["sources"].items()} == {
            s: c["in"] for s, c in after["sources"].items()
        }
    dropped = [json.loads(line) for line in (out / "dropped.jsonl").read_text().splitlines()]
    traced = Counter((d["source"], d["index"]) for d in dropped)
    kept = read_records(prepared.files["train"])
    kept_positions = {
        ("taco" if r["ability"] == "code" else "deepscaler", r["extra_info"]["index"]) for r in kept
    }
    assert max(traced.values()) == 1 and not kept_positions & set(traced)
    assert set(traced) | kept_positions == {("deepscaler", i) for i in range(10)} | {
        ("taco", i) for i in range(2)
    }
    assert {(d["index"], d["reason"]) for d in dropped if d["source"] == "deepscaler"} >= {
        (2, "malformed"),
        (1, "duplicate"),
    }
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == ["deepscaler", "taco"]
    assert all(len(i["sha256"]) == 64 for i in manifest["inputs"]) and manifest["versions"]["datasketch"]
    assert "| deepscaler | 10 | 2 |" in (out / "report.md").read_text()
    assert (out / "validation.parquet").exists() is False  # no validation source, no validation file
    detail = {(d["reason"], d["index"]): d.get("detail", "") for d in dropped if d["source"] == "deepscaler"}
    assert "Prove that 3 is prime" in detail["proof", 4] and "(A) 3 (B) 4" in detail["multiple_choice", 5]
    assert "'15'" in detail["answer_mismatch", 6] and "line 3" in detail["malformed", 2]


def test_the_console_counts_drops_per_source_and_reason(messy: Path, tmp_path: Path):
    result = CliRunner().invoke(app, ["prepare-data", "--spec", str(messy), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    lines = " ".join(result.output.split())
    assert "deepscaler: 10 in, 2 kept; dropped: malformed 2, no_answer 1, proof 1," in lines
    assert "taco: 2 in, 1 kept; dropped: no_tests 1" in lines


def test_finished_outputs_are_not_overwritten_unless_asked(messy: Path, tmp_path: Path):
    runner = CliRunner()
    out = tmp_path / "out"
    first = runner.invoke(app, ["prepare-data", "--spec", str(messy), "--out", str(out)])
    assert first.exit_code == 0, first.output
    again = runner.invoke(app, ["prepare-data", "--spec", str(messy), "--out", str(out)])
    assert again.exit_code == 2 and "--overwrite" in again.output and "Traceback" not in again.output
    forced = runner.invoke(app, ["prepare-data", "--spec", str(messy), "--out", str(out), "--overwrite"])
    assert forced.exit_code == 0, forced.output


def prepare_cli(tmp_path: Path, sources: list[dict]) -> tuple[int, str]:
    """`or1 prepare-data` over these sources (nothing but loading): exit code and the output on one line."""
    spec = {"name": "s", "sources": sources, "filters": {"enabled": False}, "dedup": {"enabled": False}}
    spec |= {"decontaminate": {"enabled": False}, "checks": {"math_answer": False, "code_solution": False}}
    path = write_spec(tmp_path / "s.yaml", spec)
    result = CliRunner().invoke(app, ["prepare-data", "--spec", str(path), "--out", str(tmp_path / "out")])
    assert "Traceback" not in result.output
    return result.exit_code, " ".join(result.output.split())


def test_a_source_whose_rows_are_all_malformed_is_refused_naming_the_source_count_and_commonest_reason(
    tmp_path: Path,
):
    """It used to end in exit 0 and a train.parquet of 0 rows and no columns, the reason only in dropped.jsonl."""
    lines = [json.dumps({"text": f"row {i}"}) for i in range(4)] + ["{not json"]
    write_jsonl(tmp_path / "bad.jsonl", lines)
    code, output = prepare_cli(tmp_path, [{"name": "bad", "path": str(tmp_path / "bad.jsonl")}])
    assert code == 2 and "source 'bad'" in output and "none of its 5 records" in output
    assert "commonest (4 of 5): no adapter recognises the keys ['text']" in output
    assert not (tmp_path / "out" / "train.parquet").exists()


def test_an_empty_source_is_refused_unless_it_allows_empty(tmp_path: Path):
    empty, good = write_jsonl(tmp_path / "empty.jsonl", []), tmp_path / "good.jsonl"
    write_jsonl(good, [json.dumps({"problem": "What is 1 plus 1?", "answer": "2"})])
    code, output = prepare_cli(tmp_path, [{"name": "e", "path": str(empty)}])
    assert code == 2 and "source 'e'" in output and "holds no records" in output and "allow_empty" in output
    sources = [{"name": "e", "path": str(empty), "allow_empty": True}, {"name": "g", "path": str(good)}]
    code, output = prepare_cli(tmp_path, sources)
    assert code == 0 and "warning: source 'e' holds no records" in output and "train 1 rows" in output


def test_spec_errors_name_the_file_and_key(tmp_path: Path):
    bad = write_spec(
        tmp_path / "bad.yaml", {"name": "x", "sources": [{"name": "a", "path": "a.jsonl"}], "dedupe": {}}
    )
    result = CliRunner().invoke(app, ["prepare-data", "--spec", str(bad), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "bad.yaml: dedupe" in result.output and "Traceback" not in result.output
    two = write_spec(
        tmp_path / "two.yaml", {"name": "x", "sources": [{"name": "a", "path": "a", "hub": "b/c"}]}
    )
    with pytest.raises(Exception, match="exactly one of path, hub or synthetic"):
        load_spec(two)


def test_shipped_specs_load():
    for name in ("tiny", "or1-math", "or1-code"):
        _, spec, _ = load_spec(name)
        assert spec.name == name and spec.difficulty.enabled


def test_tiny_spec_rows_are_the_synthetic_files(tmp_path: Path):
    """Without its difficulty step, data/tiny.yaml writes exactly what write_tiny_dataset writes."""
    from or1.data.synthetic import write_tiny_dataset

    _, _, raw = load_spec("tiny")
    raw["difficulty"]["enabled"] = False
    prepare(write_spec(tmp_path / "tiny.yaml", raw), tmp_path / "spec")
    write_tiny_dataset(tmp_path / "direct", 0)
    for name in ("train", "validation", "code_train", "code_validation"):
        got = pq.read_table(tmp_path / "spec" / f"{name}.parquet").to_pylist()
        assert got == pq.read_table(tmp_path / "direct" / f"{name}.parquet").to_pylist(), name


BENCHMARK_FILES = {
    "aime24": ("aime24/aime24.parquet", "math"),
    "aime25": ("aime25/aime25.parquet", "math"),
    "math500": ("math500/math500.jsonl", "math"),
    "amc": ("amc/amc_2022_2023.json", "math"),
    "livecodebench": ("livecodebench/lcb_2408_2502_public.json", "code"),
}


def test_benchmarks_decontaminated_against_themselves_keep_nothing(tmp_path: Path):
    if BENCHMARKS is None:
        pytest.skip("no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)")
    missing = [f for f, _ in BENCHMARK_FILES.values() if not (BENCHMARKS / f).is_file()]
    if missing:
        pytest.skip(f"benchmark files not found in {BENCHMARKS}: {missing}")
    sources = [
        {"name": name, "path": str(BENCHMARKS / f), "adapter": "benchmark", "ability": ability}
        for name, (f, ability) in BENCHMARK_FILES.items()
    ]
    spec = {
        "name": "benchmarks",
        "sources": sources,
        "filters": {"enabled": False},
        "dedup": {"enabled": False},
        "checks": {"math_answer": False, "code_solution": False},
        "decontaminate": {"benchmarks": list(BENCHMARK_FILES), "benchmark_dir": str(BENCHMARKS)},
    }
    prepared = prepare(write_spec(tmp_path / "b.yaml", spec), tmp_path / "out")
    report = prepared.report
    assert report["outputs"] == {"train": 0}
    assert {name: c["dropped"] for name, c in report["sources"].items()} == {
        "aime24": {"contaminated": 30},
        "aime25": {"contaminated": 30},
        "math500": {"contaminated": 500},
        "amc": {"contaminated": 83},
        "livecodebench": {"contaminated": 279},
    }


def test_a_hub_source_missing_offline_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import datasets.config

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    spec = write_spec(
        tmp_path / "hub.yaml", {"name": "hub", "sources": [{"name": "x", "hub": "nobody/no-such-set"}]}
    )
    result = CliRunner().invoke(app, ["prepare-data", "--spec", str(spec), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "cannot load nobody/no-such-set" in result.output and "HF_HUB_OFFLINE" in result.output


def test_a_hub_source_reads_through_datasets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`hub:` goes through datasets.load_dataset (here a local dataset folder, so no network is needed)."""
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    folder = tmp_path / "deepscaler"
    folder.mkdir()
    records = [{"problem": f"What is {i} plus {i}?", "answer": str(2 * i), "solution": ""} for i in range(5)]
    write_jsonl(folder / "train.jsonl", [json.dumps(r) for r in records])
    spec = {
        "name": "hub",
        "sources": [{"name": "ds", "hub": str(folder), "split": "train", "adapter": "deepscaler"}],
        "decontaminate": {"enabled": False},
    }
    prepared = prepare(write_spec(tmp_path / "hub.yaml", spec), tmp_path / "out")
    assert prepared.report["sources"]["ds"] == {"in": 5, "kept": 5, "dropped": {}}
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["inputs"][0]["origin"] == f"hub:{folder}:train" and manifest["inputs"][0]["revision"]


def test_benchmarks_found_nowhere_name_options_prepare_data_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """A clone not beside ../shared: the hint names OR1_BENCHMARKS and the spec key, not eval's --data flag."""
    import datasets.config

    monkeypatch.delenv("OR1_BENCHMARKS", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    data = write_jsonl(tmp_path / "d.jsonl", [json.dumps({"problem": "What is 1 plus 1?", "answer": "2"})])
    spec = write_spec(
        tmp_path / "s.yaml",
        {
            "name": "s",
            "sources": [{"name": "d", "path": str(data), "adapter": "deepscaler"}],
            "decontaminate": {"benchmarks": ["aime24"]},
        },
    )
    result = CliRunner().invoke(app, ["prepare-data", "--spec", str(spec), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "OR1_BENCHMARKS" in result.output and "decontaminate.benchmark_dir" in result.output
    assert "--data" not in result.output
