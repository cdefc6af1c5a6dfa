"""The one-stage recipe the public cases' settings complete (tests/plan/test_public*.py)."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def base_recipe(tmp_path_factory) -> str:
    """A one-stage recipe the cases' settings complete (the model is given as its shape)."""
    path = tmp_path_factory.mktemp("public") / "public.yaml"
    path.write_text(
        json.dumps(
            {
                "name": "public",
                "model": {"path": "public/model", "dtype": "bfloat16"},
                "data": {"train_files": ["train.parquet"]},
                "trainer": {"device": "cuda"},
                "stages": [{"name": "1"}],
            }
        )
    )
    return str(path)
