"""What the trainer tests compare between two runs: metrics without timings, and saved weights."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import load_file


def metrics(run_dir: Path, stage: str = "1") -> list[dict]:
    """stage<N>/metrics.jsonl without its timings."""
    lines = (run_dir / f"stage{stage}" / "metrics.jsonl").read_text().splitlines()
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(("time/", "perf/"))} for line in lines
    ]


def weights(model_dir: Path) -> dict:
    return load_file(model_dir / "model.safetensors")


def assert_same_weights(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert (a[name] == b[name]).all(), name
