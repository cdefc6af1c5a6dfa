"""Benchmark resolution and every schema converter, on the shared files and on small files written here."""

from __future__ import annotations

import base64
import datetime
import json
import pickle
import zlib
from pathlib import Path

import pytest

from or1.data.benchmarks import REGISTRY, benchmark_folder, load_benchmark
from or1.data.converters import decode_private_tests, method_name
from or1.data.rows import validate_row, write_rows
from or1.errors import UserError

BENCHMARKS = benchmark_folder()

shared = pytest.mark.skipif(
    BENCHMARKS is None or not BENCHMARKS.is_dir(),
    reason="no benchmark folder (OR1_BENCHMARKS; tests set it to ../shared/benchmarks when present)",
)


def gold(row: dict) -> object:
    return json.loads(row["reward_model"]["ground_truth"])


@shared
@pytest.mark.parametrize(
    ("name", "count"), [("aime24", 30), ("aime25", 30), ("math500", 500), ("amc", 83), ("livecodebench", 279)]
)
def test_registry_defaults_to_the_shared_files(name: str, count: int) -> None:
    bench = load_benchmark(name)
    assert len(bench.rows) == count
    assert bench.source.startswith(str(BENCHMARKS.resolve()))
    assert len(bench.sha256) == 64
    for i, row in enumerate(bench.rows):
        validate_row(row, where=f"{name} {i}")
        assert row["ability"] == REGISTRY[name].ability


@shared
def test_or1_row_files_pass_through_unchanged() -> None:
    jsonl = load_benchmark("aime24", data=BENCHMARKS / "aime24" / "aime24.jsonl").rows
    parquet = load_benchmark("aime24").rows
    assert [r["prompt"] for r in jsonl] == [r["prompt"] for r in parquet]
    assert (
        jsonl[1]["reward_model"]["ground_truth"] == "025"
    )  # zero-padded gold kept; the reward compares integers


@shared
def test_math_schemas_become_json_list_golds() -> None:
    qwen = load_benchmark("aime24", data=BENCHMARKS / "aime24" / "aime24_qwen25math.jsonl").rows
    assert len(qwen) == 30 and all(isinstance(gold(r), list) and len(gold(r)) == 1 for r in qwen)
    assert qwen[0]["prompt"][0]["content"].startswith("Every morning Aya")
    assert qwen[0]["prompt"][0]["content"].endswith("within \\boxed{}.")
    areal = load_benchmark("aime25", data=BENCHMARKS / "aime25" / "aime25_areal.jsonl").rows
    assert gold(areal[0]) == ["70"] and gold(areal[1]) == ["588"]  # integer answers as integer text
    amc = load_benchmark("amc").rows
    assert gold(amc[0]) == ["142"]  # 142.0 in the file
    assert len(load_benchmark("amc", data=BENCHMARKS / "amc" / "amc23.jsonl").rows) == 40
    math500 = load_benchmark("math500").rows
    assert gold(math500[0]) == ["\\left( 3, \\frac{\\pi}{2} \\right)"]
    assert math500[0]["extra_info"]["subject"] == "Precalculus"


@shared
def test_livecodebench_public_file_converts_both_test_forms() -> None:
    bench = load_benchmark("livecodebench")
    assert bench.date_filter.startswith("not applied")
    records = json.loads((BENCHMARKS / "livecodebench" / "lcb_2408_2502_public.json").read_text())
    for record, row in zip(records, bench.rows, strict=True):
        truth = gold(row)
        assert truth["inputs"] == [t["input"] for t in record["tests"]]
        assert truth["outputs"] == [t["output"] for t in record["tests"]]
        if record["tests"][0]["testtype"] == "functional":
            assert truth["fn_name"] == method_name(record["starter_code"])
            assert f"def {truth['fn_name']}(" in row["prompt"][0]["content"]
        else:
            assert "fn_name" not in truth and "standard input" in row["prompt"][0]["content"]


def test_method_name_takes_the_method_of_the_starter_class() -> None:
    starter = "class Solution:\n    def helper(x):\n        pass\n    def maxScore(self, nums: List[int]) -> int:\n        "
    assert method_name(starter) == "maxScore"
    assert method_name("") is None


def _private(tests: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(tests)))).decode()


def hub_record(date: str, title: str) -> dict:
    return {
        "question_title": title,
        "question_content": f"Print the sum of two integers ({title}).",
        "platform": "atcoder",
        "question_id": title,
        "contest_date": date,
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "1 2\n", "output": "3\n", "testtype": "stdin"}]),
        "private_test_cases": _private([{"input": "5 5\n", "output": "10\n", "testtype": "stdin"}]),
        "metadata": "{}",
    }


def test_hub_livecodebench_rows_are_windowed_by_date_and_private_tests_decoded(tmp_path: Path) -> None:
    path = tmp_path / "lcb.jsonl"
    dates = ["2024-07-31T00:00:00", "2024-08-01T00:00:00", "2024-12-25T12:00:00", "2025-03-01T00:00:00"]
    path.write_text("".join(json.dumps(hub_record(d, f"p{i}")) + "\n" for i, d in enumerate(dates)))
    bench = load_benchmark("livecodebench", data=path)
    assert [r["extra_info"]["question_id"] for r in bench.rows] == ["p1", "p2"]
    assert "kept 2 of 4" in bench.date_filter
    assert gold(bench.rows[0]) == {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    wide = load_benchmark(
        "livecodebench", data=path, window=(datetime.date(2024, 1, 1), datetime.date(2026, 1, 1))
    )
    assert len(wide.rows) == 4


def test_hub_functional_problems_take_func_name_from_metadata(tmp_path: Path) -> None:
    record = hub_record("2024-09-01T00:00:00", "f")
    record["starter_code"] = "class Solution:\n    def add(self, a: int, b: int) -> int:\n        "
    record["metadata"] = json.dumps({"func_name": "add"})
    record["public_test_cases"] = json.dumps([{"input": "1\n2", "output": "3", "testtype": "functional"}])
    record["private_test_cases"] = json.dumps(
        [{"input": "2\n2", "output": "4", "testtype": "functional"}]
    )  # plain JSON form
    path = tmp_path / "lcb.jsonl"
    path.write_text(json.dumps(record) + "\n")
    truth = gold(load_benchmark("livecodebench", data=path).rows[0])
    assert truth == {"inputs": ["1\n2", "2\n2"], "outputs": ["3", "4"], "fn_name": "add"}


def test_private_test_decoder_accepts_only_a_pickled_string() -> None:
    assert (
        decode_private_tests(_private([{"input": "x", "output": "y", "testtype": "stdin"}]))[0]["output"]
        == "y"
    )
    smuggled = base64.b64encode(zlib.compress(pickle.dumps(datetime.date(2024, 1, 1)))).decode()
    with pytest.raises(UserError, match="only a pickled string"):
        decode_private_tests(smuggled)
    not_text = base64.b64encode(zlib.compress(pickle.dumps([1, 2]))).decode()
    with pytest.raises(UserError, match="expected a JSON string"):
        decode_private_tests(not_text)
    with pytest.raises(UserError):
        decode_private_tests("!!not base64 at all!!")


def test_an_or1_row_file_is_a_benchmark(tmp_path: Path) -> None:
    row = {
        "data_source": "mine",
        "prompt": [{"role": "user", "content": "1+1?"}],
        "ability": "math",
        "reward_model": {"ground_truth": '["2"]', "style": "rule"},
        "extra_info": {"index": 0},
    }
    path = write_rows(tmp_path / "mine.parquet", [row, row])
    bench = load_benchmark(str(path))
    assert (bench.name, bench.ability, len(bench.rows)) == ("mine", "math", 2)


def test_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="Unknown benchmark"):
        load_benchmark("aime99")
    with pytest.raises(UserError, match="does not exist"):
        load_benchmark("aime24", data=tmp_path / "missing.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"question_text": "no answer here"}) + "\n")
    with pytest.raises(UserError, match="record 0"):
        load_benchmark("aime24", data=bad)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(UserError, match="Cannot read"):
        load_benchmark("amc", data=broken)
    mixed = tmp_path / "mixed.json"
    mixed.write_text(
        json.dumps(
            [
                {
                    "problem": "p",
                    "starter_code": "",
                    "tests": [
                        {"input": "1", "output": "1", "testtype": "stdin"},
                        {"input": "1", "output": "1", "testtype": "functional"},
                    ],
                }
            ]
        )
    )
    with pytest.raises(UserError, match="must all be 'stdin' or all 'functional'"):
        load_benchmark("livecodebench", data=mixed)


def test_hub_sources_are_loaded_in_order_and_converted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import datasets

    calls = []

    def fake_load(**kwargs):
        calls.append(kwargs)
        part = kwargs.get("name")
        return [
            {"question": f"{part} problem {i}", "answer": str(i)}
            for i in range(2 if part == "AIME2025-I" else 1)
        ]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    bench = load_benchmark("aime25", folder=tmp_path)  # no shared file there: the hub path
    assert [c["name"] for c in calls] == ["AIME2025-I", "AIME2025-II"]
    assert [r["prompt"][0]["content"].split(" problem")[0] for r in bench.rows] == [
        "AIME2025-I",
        "AIME2025-I",
        "AIME2025-II",
    ]
    assert bench.source == "hub:opencompass/AIME2025" and bench.sha256 is None

    def offline(**kwargs):
        raise ConnectionError("no network")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(UserError, match="pass --data"):
        load_benchmark("math500", folder=tmp_path)
