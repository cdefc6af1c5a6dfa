"""The CLI surface: every command has help, score writes what it promises, user errors are one line."""

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from or1.cli import app

runner = CliRunner()


def test_help_lists_the_commands():
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for command in ("score", "sandbox", "config", "doctor"):
        assert command in result.output


def test_score_jsonl_to_parquet_keeps_every_row(tmp_path):
    rows = [
        {
            "ability": "math",
            "response": "so \\boxed{025}",
            "reward_model": {"ground_truth": '["25"]'},
            "id": 1,
        },
        {"ability": "math", "response": "Answer: 7", "reward_model": {"ground_truth": '["8"]'}, "id": 2},
        {"ability": "math", "response": 5, "reward_model": {"ground_truth": '["8"]'}, "id": 3},  # malformed
        {
            "ability": "math",
            "response": "no final answer here",
            "reward_model": {"ground_truth": "8"},
            "id": 4,
        },
    ]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["score", str(source), "-o", str(tmp_path / "out.parquet"), "--workers", "1"])
    assert result.exit_code == 0, result.output
    scored = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(r["id"], r["score"], r["reason"]) for r in scored] == [
        (1, 1.0, "correct"),
        (2, 0.0, "wrong_answer"),
        (3, 0.0, "bad_input"),
        (4, 0.0, "no_answer"),
    ]


def test_score_missing_input_is_one_line(tmp_path):
    result = runner.invoke(app, ["score", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 2 and "does not exist" in result.output and "Traceback" not in result.output


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("bwrap"), reason="local sandbox needs root and bubblewrap"
)
def test_sandbox_check_passes_on_the_local_backend():
    result = runner.invoke(app, ["sandbox", "check", "--backend", "local"])
    assert result.exit_code == 0, result.output
    assert "sandbox checks passed" in result.output


def test_user_errors_keep_text_in_brackets(capsys):
    import typer

    from or1.cli import user_errors
    from or1.errors import UserError

    @user_errors
    def fails():
        raise UserError("the vllm engine needs the extra: pip install 'or1[vllm]' (see [docs])")

    with pytest.raises(typer.Exit) as exit_:
        fails()
    assert exit_.value.exit_code == 2
    assert "pip install 'or1[vllm]' (see [docs])" in capsys.readouterr().err


def test_an_interrupted_command_names_the_rerun_and_exits_128_plus_the_signal(capsys, monkeypatch):
    import signal

    import typer

    from or1.cli import user_errors
    from or1.stop import Interrupted

    argv = ["or1", "train", "--recipe", "tiny", "--resume", "never", "--overwrite", "--set", "a.b=[x]"]
    monkeypatch.setattr("sys.argv", argv)

    @user_errors
    def stops():
        raise Interrupted(signal.SIGTERM, "stopped after step 3 of 10 (checkpoint runs/x/step_3)")

    with pytest.raises(typer.Exit) as exit_:
        stops()
    assert exit_.value.exit_code == 143
    err = capsys.readouterr().err
    assert "stopped after step 3 of 10 (checkpoint runs/x/step_3)" in err
    # the same command minus what would throw the saved work away
    assert "to resume, run: or1 train --recipe tiny --set 'a.b=[x]'" in err


def test_ctrl_c_in_a_command_without_a_graceful_stop_is_one_line_and_130(capsys, monkeypatch):
    import typer

    from or1.cli import user_errors

    monkeypatch.setattr("sys.argv", ["or1", "prepare-data", "--out", "data"])

    @user_errors
    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(typer.Exit) as exit_:
        interrupted()
    assert exit_.value.exit_code == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and "to start again, run: or1 prepare-data --out data" in err
