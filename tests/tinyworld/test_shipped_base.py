"""The tiny base shipped with or1 is what the main command starts from, and what `or1 init-model` builds.

Fast tests: `or1 init-model` writes the shipped bits; the shipped files are the ones its report hashed; the report's
recipe is init_tiny_model's defaults, its training data and tokenizer what the code builds today (a change to the
tasks, the tokenizer or the warm-start settings fails here until the base is rebuilt and shipped again); the tiny
recipe and data spec read the folder the main command writes. Slow: a rebuild on this machine, checked against the
shipped base.
"""

from __future__ import annotations

import inspect
import itertools
import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import yaml

from or1.tinyworld.architecture import TinyModelSpec
from or1.tinyworld.init import (
    PINNED_KERNELS,
    REPORT_FILE,
    InitReport,
    _tokenizer_corpus,
    file_hashes,
    init_tiny_model,
    sft_data_sha256,
)
from or1.tinyworld.shipped import (
    MODEL_FILES,
    SHIPPED_BASE,
    SHIPPED_RECIPE,
    compare_with_shipped,
    shipped_report,
)
from or1.tinyworld.tokenizer import train_tokenizer
from or1.tinyworld.warmstart import FIRST_LOSSES, SFTConfig

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "COLUMNS": "1000"}
HF_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


def or1(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "or1.cli", *args], capture_output=True, text=True, env=ENV)


def test_the_shipped_files_are_the_ones_its_report_hashed() -> None:
    report = shipped_report()  # raises when a file differs from the hash its report recorded
    assert set(report.files) == HF_FILES
    assert {p.name for p in SHIPPED_BASE.iterdir()} == HF_FILES | {REPORT_FILE}


def test_init_model_writes_the_shipped_base(tmp_path: Path) -> None:
    out = tmp_path / "model"
    done = or1("init-model", "--preset", "tiny", "--out", str(out))
    assert done.returncode == 0, done.stderr
    report = shipped_report()
    assert file_hashes(out) == report.files
    assert (out / REPORT_FILE).read_bytes() == (SHIPPED_BASE / REPORT_FILE).read_bytes()
    assert f"{report.solve_rate.overall:.1%}" in done.stdout and "shipped with or1" in done.stdout
    again = or1("init-model", "--out", str(out))
    assert again.returncode == 2 and "not empty" in again.stderr


def test_the_shipped_base_is_what_init_model_builds_today() -> None:
    """Its recipe is init_tiny_model's defaults, on the same data and tokenizer the code makes now."""
    report, defaults = shipped_report(), inspect.signature(init_tiny_model).parameters
    assert (report.seed, report.sft.steps) == SHIPPED_RECIPE
    assert SHIPPED_RECIPE == (defaults["seed"].default, defaults["sft_steps"].default)
    for key in ("batch_size", "lr", "eval_samples", "eval_max_new_tokens"):
        assert report.settings[key] == defaults[key].default, key
    assert report.threads == defaults["threads"].default
    assert report.settings["spec"] == asdict(TinyModelSpec())
    assert {k: report.settings["kernels"][k] for k in PINNED_KERNELS} == PINNED_KERNELS
    cfg = SFTConfig(
        steps=report.sft.steps, batch_size=report.settings["batch_size"], lr=report.settings["lr"]
    )
    assert report.settings["data_sha256"] == sft_data_sha256(report.seed, cfg), (
        "the warm start's data changed"
    )
    tokenizer = train_tokenizer(_tokenizer_corpus(report.seed))
    assert len(tokenizer) == report.vocab_size
    shipped = json.loads((SHIPPED_BASE / "tokenizer.json").read_text())
    assert json.loads(tokenizer.backend_tokenizer.to_str()) == shipped, (
        "the tokenizer's corpus or training changed"
    )
    config = json.loads((SHIPPED_BASE / "config.json").read_text())
    assert config["vocab_size"] == report.vocab_size
    assert config["hidden_size"] == TinyModelSpec().hidden_size
    assert config["num_hidden_layers"] == TinyModelSpec().num_hidden_layers


def test_the_report_records_where_and_how_the_warm_start_began() -> None:
    report = shipped_report()
    assert report.machine["cpu"] and report.machine["vendor"] and "avx2" in report.machine["flags"]
    assert len(report.sft.first_losses) == FIRST_LOSSES
    assert report.sft.first_losses[0] > 5 > report.sft.first_losses[-1]  # ln(379) = 5.9 at the start
    assert report.sft.final_loss < 0.2
    assert 0.4 < report.solve_rate.overall < 0.6 and 0.1 < report.code_solve_rate.overall < 0.25


def test_the_main_command_trains_and_grades_with_the_folder_init_model_writes() -> None:
    """`just tiny` writes the base with `or1 init-model --out tiny/model`; the recipe trains from that folder and
    the data spec grades the prompts with it."""
    lines = (ROOT / "Justfile").read_text().splitlines()
    body = itertools.takewhile(lambda line: line.startswith(" "), lines[lines.index("tiny:") + 1 :])
    init = next(line for line in body if "or1 init-model" in line)
    folder = init.split("--out ")[1].split()[0]
    assert "--rebuild" not in init
    assert yaml.safe_load((ROOT / "stages" / "tiny.yaml").read_text())["model"]["path"] == folder
    assert yaml.safe_load((ROOT / "data" / "tiny.yaml").read_text())["difficulty"]["model"] == folder


def test_a_build_of_the_same_recipe_says_where_it_parts_from_the_shipped_base() -> None:
    shipped = shipped_report()
    assert compare_with_shipped(shipped) == "Same bits as the tiny base shipped with or1."
    losses = list(shipped.sft.first_losses)
    losses[3] += 1e-7
    other = replace(
        shipped,
        files={**shipped.files, "model.safetensors": "0" * 64},
        sft=replace(shipped.sft, first_losses=tuple(losses)),
    )
    assert "the warm-start losses part at step 3" in compare_with_shipped(other)
    other = replace(other, files={**other.files, "tokenizer.json": "0" * 64})
    assert "their tokenizers differ" in compare_with_shipped(other)
    assert compare_with_shipped(replace(shipped, seed=1)) is None  # another recipe: nothing to compare


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_rebuild_here_is_the_shipped_base_or_a_base_at_the_frontier(tmp_path: Path) -> None:
    """`or1 init-model --rebuild` on this machine (about 7 minutes). On the AMD EPYC processors measured it is the
    shipped bits, and its rates then read within 3 points of the shipped report's (the same model, sampled under
    this machine's kernels). Elsewhere it may be another model (an Intel Xeon's read 24.4% / 16.6%), and the band
    is the frontier the recipe needs: arithmetic 15-85%, programs 5-50%, a warm-start loss under 0.2."""
    out = tmp_path / "model"
    done = or1("init-model", "--rebuild", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    built, shipped = InitReport.read(out), shipped_report()
    same = all(built.files[name] == shipped.files[name] for name in MODEL_FILES)
    print(done.stdout.splitlines()[-1])
    assert ("Same bits" in done.stdout) == same
    rates = (built.solve_rate.overall, built.code_solve_rate.overall)
    if same:
        assert abs(rates[0] - shipped.solve_rate.overall) <= 0.03, rates
        assert abs(rates[1] - shipped.code_solve_rate.overall) <= 0.03, rates
    else:
        assert 0.15 <= rates[0] <= 0.85 and 0.05 <= rates[1] <= 0.5, rates
        assert built.sft.final_loss < 0.2
