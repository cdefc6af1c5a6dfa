"""The metrics contract (or1.run_metrics): the readers of metrics.jsonl spell no key of their own, every name is
declared with its unit and meaning, docs/metrics.md is that table, and the one reader skips a torn line."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import or1.run_metrics as run_metrics
from or1.run_metrics import METRICS, STEP, metrics_table, read_metrics

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "or1"
# what reads metrics.jsonl outside the trainer's writing of it: run health, or1 report, the stage summary, the
# planner's expected lengths
READERS = [
    *sorted((SRC / "health").glob("*.py")),
    *sorted((SRC / "report").glob("*.py")),
    SRC / "trainer" / "summary.py",
]
READERS.append(SRC / "plan" / "lengths.py")
FAMILIES = "reward|math|code|batch|response|actor|entropy|mismatch|time|perf|val|async|critic"
SPELLED_KEY = re.compile(rf"^({FAMILIES})/|^/(reward_mean|truncated_frac|avg@)|_per_device$|^perf/share_")


def spelled_keys(path: Path) -> list[str]:
    """String literals (f-string parts included, docstrings left out) that look like a metric key."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{path.name}:{node.lineno}: {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and SPELLED_KEY.search(node.value)
    ]


def test_readers_name_every_key_through_the_contract() -> None:
    found = [hit for path in READERS for hit in spelled_keys(path)]
    assert not found, f"metric keys spelled outside or1.run_metrics: {found}"


def test_the_check_sees_a_spelled_key(tmp_path: Path) -> None:
    module = tmp_path / "reader.py"
    module.write_text('"""doc: reward/mean is fine here."""\nx = r["reward/mean"]\ny = f"{a}/reward_mean"\n')
    assert [hit.split(": ", 1)[1] for hit in spelled_keys(module)] == ["'reward/mean'", "'/reward_mean'"]


def test_every_name_is_declared_with_unit_and_meaning() -> None:
    names = {
        value
        for name, value in vars(run_metrics).items()
        if name.isupper() and isinstance(value, str) and name != "VALIDATION_PREFIX"
    }
    assert names <= set(METRICS)
    assert all(m.unit and m.meaning for m in METRICS.values())


def test_the_docs_table_is_the_contract() -> None:
    assert metrics_table() in (ROOT / "docs" / "metrics.md").read_text(), (
        "regenerate: python -m or1.run_metrics"
    )


def test_one_reader_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    assert read_metrics(path) == []
    path.write_text(json.dumps({STEP: 0, "val/x/t1/avg@4": 0.5}) + "\n" + '["no step"]\n{"step": 1, "rew')
    assert read_metrics(path) == [{STEP: 0, "val/x/t1/avg@4": 0.5}]
