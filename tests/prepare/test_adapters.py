"""Each adapter on a small file written in its dataset's real schema, read through the one record reader."""

from __future__ import annotations

import base64
import json
import pickle
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from or1.data.converters import MATH_SUFFIX
from or1.data.records import BadRecord, iter_records, read_records
from or1.errors import UserError
from or1.prepare.adapters import Context, Malformed, adapt, detect
from or1.rewards.code_tests import parse_ground_truth


def ctx(index: int = 0, ability: str | None = None) -> Context:
    return Context("train-x", "train", index, ability)


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def one(path: Path, adapter: str, ability: str | None = None) -> dict:
    (record,) = read_records(path)
    return adapt(adapter, record, ctx(0, ability))


def test_deepscaler_parquet(tmp_path: Path):
    path = tmp_path / "deepscaler.parquet"
    record = {"problem": "Find $x$ if $2x=10$.", "answer": "5", "solution": "So $x=\\boxed{5}$."}
    pq.write_table(pa.Table.from_pylist([record]), path)
    row = one(path, "deepscaler")
    assert row["prompt"] == [{"role": "user", "content": f"Find $x$ if $2x=10$. {MATH_SUFFIX}"}]
    assert (row["ability"], json.loads(row["reward_model"]["ground_truth"])) == ("math", ["5"])
    assert row["extra_info"] == {"index": 0, "split": "train", "solution": "So $x=\\boxed{5}$."}
    assert detect(record) == "still"  # problem + answer alone: the generic math adapter reads it the same way


def test_numina_keeps_the_hints_the_filters_need(tmp_path: Path):
    record = {
        "problem": "Prove that $n^2 \\ge 0$.",
        "solution": "Squares are nonnegative.",
        "answer": "proof",
        "problem_type": "Algebra",
        "question_type": "proof",
        "source": "olympiads",
        "synthetic": False,
    }
    row = one(write_jsonl(tmp_path / "numina.jsonl", [record]), "numina")
    assert detect(record) == "numina"
    extra = row["extra_info"]
    assert (extra["question_type"], extra["source"], extra["problem_type"]) == (
        "proof",
        "olympiads",
        "Algebra",
    )
    assert json.loads(row["reward_model"]["ground_truth"]) == ["proof"]


def test_still_and_omni_math(tmp_path: Path):
    still = {"question": "What is $1+1$?", "answer": "2"}
    omni = {
        "domain": ["Math > Algebra"],
        "difficulty": 6.5,
        "problem": "Compute 7*6.",
        "solution": "\\boxed{42}",
        "answer": "42",
        "source": "imo",
    }
    rows = [adapt("still", still, ctx()), adapt("omni-math", omni, ctx(1))]
    assert rows[0]["prompt"][0]["content"].startswith("What is $1+1$?")
    assert rows[1]["extra_info"]["difficulty"] == 6.5 and rows[1]["extra_info"]["solution"] == "\\boxed{42}"
    assert [json.loads(r["reward_model"]["ground_truth"]) for r in rows] == [["2"], ["42"]]


def test_skywork_rows_pass_through_without_padded_none_keys(tmp_path: Path):
    truth = {"inputs": ["1\n"], "outputs": ["2\n"], "fn_name": None}  # what datasets.map leaves behind
    rows = [
        {
            "data_source": "train-code-taco-medium",
            "prompt": [{"role": "user", "content": "Add one."}],
            "ability": "code",
            "reward_model": {"ground_truth": json.dumps(truth), "style": "rule"},
            "extra_info": {"index": 7, "model_difficulty": {"DeepSeek-R1-Distill-Qwen-7B": 3, "Other": None}},
        }
    ]
    path = tmp_path / "skywork.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    row = one(path, "auto")
    assert json.loads(row["reward_model"]["ground_truth"]) == {"inputs": ["1\n"], "outputs": ["2\n"]}
    assert row["extra_info"]["model_difficulty"] == {"DeepSeek-R1-Distill-Qwen-7B": 3}
    assert row["data_source"] == "train-code-taco-medium"  # or1 rows keep their own source name


def test_taco_stdin_and_call_based(tmp_path: Path):
    stdin = {
        "question": "Read n and print n+1.",
        "solutions": json.dumps(["print(int(input()) + 1)"]),
        "starter_code": "",
        "input_output": json.dumps({"inputs": ["1\n", "5\n"], "outputs": ["2\n", "6\n"]}),
        "difficulty": "EASY",
        "picture_num": 0,
        "url": "https://codeforces.com/problemset/problem/1/A",
    }
    call = {
        "question": "Return the sum of a list.",
        "solutions": json.dumps(["class Solution:\n    def total(self, xs):\n        return sum(xs)\n"]),
        "starter_code": "class Solution:\n    def total(self, xs):\n        ",
        "input_output": json.dumps({"inputs": [[[1, 2]], [[5]]], "outputs": [[3], [5]], "fn_name": "total"}),
        "difficulty": "EASY",
        "picture_num": 2,
    }
    rows = [
        adapt("auto", r, ctx(i))
        for i, r in enumerate(read_records(write_jsonl(tmp_path / "t.jsonl", [stdin, call])))
    ]
    assert detect(stdin) == "taco"
    assert json.loads(rows[0]["reward_model"]["ground_truth"]) == {
        "inputs": ["1\n", "5\n"],
        "outputs": ["2\n", "6\n"],
    }
    assert rows[0]["extra_info"]["reference_solution"] == "print(int(input()) + 1)"
    assert "has_figure" not in rows[0]["extra_info"] and rows[1]["extra_info"]["has_figure"] is True
    assert json.loads(rows[1]["reward_model"]["ground_truth"])["fn_name"] == "total"
    assert "def total(self, xs)" in rows[1]["prompt"][0]["content"]
    assert len(parse_ground_truth(rows[1]["reward_model"]["ground_truth"])) == 2  # the code reward reads it


def test_livecodebench_private_tests_decode_and_globals_are_refused(tmp_path: Path):
    private = [{"input": "3\n", "output": "9\n", "testtype": "stdin"}]
    blob = base64.b64encode(zlib.compress(pickle.dumps(json.dumps(private)))).decode()
    record = {
        "question_title": "Square",
        "question_content": "Print n squared.",
        "platform": "atcoder",
        "question_id": "abc000_a",
        "contest_date": "2024-09-01T00:00:00",
        "starter_code": "",
        "difficulty": "easy",
        "public_test_cases": json.dumps([{"input": "2\n", "output": "4\n", "testtype": "stdin"}]),
        "private_test_cases": blob,
        "metadata": "{}",
    }
    row = one(write_jsonl(tmp_path / "lcb.jsonl", [record]), "livecodebench")
    assert json.loads(row["reward_model"]["ground_truth"]) == {
        "inputs": ["2\n", "3\n"],
        "outputs": ["4\n", "9\n"],
    }
    assert row["extra_info"]["split"] == "train"

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    hostile = {**record, "private_test_cases": base64.b64encode(zlib.compress(pickle.dumps(Evil()))).decode()}
    with pytest.raises(Malformed, match="only a pickled string"):
        adapt("livecodebench", hostile, ctx())


def test_leetcode_assert_form(tmp_path: Path):
    record = {
        "task_id": "two-sum",
        "question_id": 1,
        "difficulty": "Easy",
        "problem_description": "Return indices of two numbers adding to target.",
        "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
        "prompt": "from typing import List\n",
        "completion": "class Solution:\n    def twoSum(self, nums, target):\n        seen = {}\n"
        "        for i, x in enumerate(nums):\n            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i\n",
        "entry_point": "Solution().twoSum",
        "test": "def check(candidate):\n    assert candidate([2, 7, 11, 15], 9) == [0, 1]\n",
    }
    row = one(write_jsonl(tmp_path / "leetcode.jsonl", [record]), "auto")
    truth = json.loads(row["reward_model"]["ground_truth"])
    assert truth == {
        "import_prefix": "from typing import List\n",
        "test_code": record["test"],
        "entry_point": "Solution().twoSum",
    }
    assert row["extra_info"]["reference_solution"] == record["completion"]


@pytest.mark.parametrize(
    ("record", "match"),
    [
        ({"answer": "3"}, "no adapter recognises"),
        ({"question": "x", "input_output": "{not json"}, "input_output is not valid JSON"),
        ({"problem": "x", "answer": True}, "math answer"),
        ({"prompt": "not a list", "reward_model": {}}, "data_source"),
    ],
)
def test_malformed_records_raise_malformed_not_crash(record: dict, match: str):
    with pytest.raises(Malformed, match=match):
        adapt("auto", record, ctx())


def test_reader_returns_bad_lines_at_their_positions(tmp_path: Path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('{"problem": "a", "answer": "1"}\n{broken\n\n[1, 2]\n{"problem": "b", "answer": "2"}\n')
    got = list(iter_records(path))
    assert [i for i, _ in got] == [0, 1, 2, 3]
    assert isinstance(got[1][1], BadRecord) and "not valid JSON" in got[1][1].reason
    assert isinstance(got[2][1], BadRecord) and got[2][1].reason == "line 4: not a JSON object"
    with pytest.raises(UserError, match="record 1: line 2: not valid JSON"):
        read_records(path)
    with pytest.raises(UserError, match="must end in .parquet, .jsonl, .json"):
        read_records(tmp_path / "data.csv")


SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "benchmarks"


@pytest.mark.parametrize(
    ("file", "ability", "count"),
    [
        ("aime24/aime24.parquet", "math", 30),
        ("aime25/aime25_areal.jsonl", "math", 30),
        ("math500/math500.jsonl", "math", 500),
        ("amc/amc_2022_2023.json", "math", 83),
        ("livecodebench/lcb_2408_2502_public.json", "code", 279),
    ],
)
def test_benchmark_files_adapt(file: str, ability: str, count: int):
    path = SHARED / file
    if not path.is_file():
        pytest.skip(f"{path} not found")
    rows = [adapt("benchmark", r, ctx(i, ability)) for i, r in enumerate(read_records(path))]
    assert len(rows) == count and {r["ability"] for r in rows} == {ability}
