"""prepare-data on real public rows (../shared/realdata, see its SOURCES.md): what a user loses on real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from or1.prepare import verifiable
from or1.prepare.adapters import Context, adapt

REALDATA = Path(__file__).resolve().parents[3] / "shared" / "realdata"


def real(relative: str) -> Path:
    path = REALDATA / relative
    if not path.exists():
        pytest.skip(f"{path} not found (the real-data samples live beside the checkout in shared/realdata)")
    return path


def jsonl(relative: str) -> list[dict]:
    return [json.loads(line) for line in real(relative).read_text().splitlines() if line.strip()]


def test_taco_picture_num_as_hub_string_zero_is_no_figure():
    rows = jsonl("taco/taco_picture_num_variants.jsonl")
    reasons = {
        repr(r["picture_num"]): verifiable.unverifiable_reason(adapt("taco", r, Context("taco", "train", i)))
        for i, r in enumerate(rows)
    }
    assert reasons == {"'0'": None, "None": None, "'1'": verifiable.URL_OR_FIGURE, "0": None}


def test_taco_card_row_is_kept_and_both_references_pass():
    from or1.rewards.code import score_code_batch
    from or1.sandbox.pool import close_pools, unavailable

    record = jsonl("taco/taco_card_example_1492B.jsonl")[0]
    row = adapt("taco", record, Context("taco", "train", 0))
    assert verifiable.unverifiable_reason(row) is None
    if unavailable("local"):
        pytest.skip(unavailable("local"))
    solutions = json.loads(record["solutions"])
    truth = row["reward_model"]["ground_truth"]
    try:
        results = score_code_batch([f"```python\n{s}\n```" for s in solutions], [truth] * len(solutions))
    finally:
        close_pools()
    assert [r.score for r in results] == [1.0] * len(solutions), results


def test_aime24_validation_source_of_or1_math_keeps_all_30(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Validation rows are never filtered (figures, a URL) nor deduplicated away: avg@k is over all 30."""
    import yaml

    from or1.prepare.pipeline import prepare
    from or1.prepare.spec import SPECS_DIR

    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the spec's relative paths start at the checkout
    spec = yaml.safe_load((SPECS_DIR / "or1-math.yaml").read_text())
    aime24 = next(s for s in spec["sources"] if s["name"] == "aime24")
    if not Path(aime24["path"]).exists():
        pytest.skip(f"{aime24['path']} not found (the shared benchmark files live beside the checkout)")
    twin = {**aime24, "name": "aime24-again"}  # the same problems twice: validation rows still all stay
    (tmp_path / "spec.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "validation-only",
                "sources": [aime24, twin],
                "decontaminate": {"enabled": False},
                "checks": {"math_answer": True, "code_solution": False, "workers": 1},
            }
        )
    )
    report = prepare(tmp_path / "spec.yaml", tmp_path / "out").report
    assert report["sources"]["aime24"] == {"in": 30, "kept": 30, "dropped": {}}
    assert report["sources"]["aime24-again"]["kept"] == 30


def test_aime_rows_are_never_multiple_choice_multi_part_or_proofs():
    """AIME answers are integers 0-999: the only verifiability drop on real AIME rows is a figure (or a URL)."""
    rows = json.loads(real("deepscaler/train_aime.json").read_text())
    reasons = {
        verifiable.unverifiable_reason(adapt("deepscaler", r, Context("aime", "train", i)))
        for i, r in enumerate(rows)
    }
    assert reasons <= {None, verifiable.URL_OR_FIGURE}


def test_a_list_answer_is_a_list_of_answers_not_python_text():
    rows = json.loads(real("mangled/deepscaler_mangled.json").read_text())
    listed = next(r for r in rows if isinstance(r.get("answer"), list))
    row = adapt("deepscaler", listed, Context("ds", "train", 3))
    assert json.loads(row["reward_model"]["ground_truth"]) == [str(a) for a in listed["answer"]]


# DeepScaleR AIME rows (1983-2023) that really are evaluation problems: AIME problems MATH-500 contains
AIME_IN_MATH500 = {1, 177, 188, 302, 326, 454, 560, 725, 744, 786}


def test_decontamination_weighs_distinctive_content_over_stock_phrasing():
    """DeepScaleR AIME: the real overlaps are caught, at most 1% more (stock phrasing such as "m and n are
    relatively prime positive integers. Find m+n" is no evidence), and every evaluation problem fed in is caught."""
    from or1.data.benchmarks import load_benchmark
    from or1.prepare.dedup import ContaminationIndex

    folder = REALDATA.parent / "benchmarks"
    if not folder.is_dir():
        pytest.skip(f"{folder} not found (the shared benchmark files live beside the checkout)")
    evals = []
    for name in ("aime24", "aime25", "math500", "amc", "livecodebench"):
        data = load_benchmark(name, folder=folder, window=None)
        evals += [(f"{name}:{i}", verifiable.problem_text(r)) for i, r in enumerate(data.rows)]
    aime = json.loads(real("deepscaler/train_aime.json").read_text())
    texts = [
        verifiable.problem_text(adapt("deepscaler", r, Context("ds", "train", i))) for i, r in enumerate(aime)
    ]
    fed = [
        verifiable.problem_text(adapt("deepscaler", r, Context("ds", "train", i)))
        for file in ("test_aime.json", "test_amc.json", "test_math.json")
        for i, r in enumerate(json.loads(real(f"deepscaler/{file}").read_text()))
    ]
    index = ContaminationIndex(evals, n=13, background=texts + fed)
    flagged = {i for i, text in enumerate(texts) if index.match(text)}
    assert flagged >= AIME_IN_MATH500
    assert len(flagged - AIME_IN_MATH500) <= len(texts) // 100, sorted(flagged - AIME_IN_MATH500)
    assert [i for i, text in enumerate(fed) if index.match(text) is None] == []
