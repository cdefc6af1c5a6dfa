"""The CLI surface: every command has help with examples that parse, one flag name for one thing (old names still
work and say the new one), score writes what it promises, user errors are one line."""

import json
import os
import shlex
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from or1.cli import app

runner = CliRunner()
SHIPPED_BASE = Path(__file__).resolve().parents[1] / "src" / "or1" / "tinyworld" / "tiny-base"


def commands() -> list[tuple[list[str], object]]:
    """(the words that name it, the click command) of `or1` itself and of every command and group below it."""
    import typer

    found, todo = [], [([], typer.main.get_command(app))]
    while todo:
        path, command = todo.pop(0)
        found.append((path, command))
        todo += [([*path, name], sub) for name, sub in sorted(getattr(command, "commands", {}).items())]
    return found


@pytest.mark.parametrize(
    ("path", "command"), commands(), ids=lambda x: " ".join(x) if isinstance(x, list) else ""
)
def test_every_command_shows_one_or_two_examples_that_parse(path, command):
    """Each example is run with --help appended: it names this command and only flags it has (an unknown flag
    or a removed one is exit 2, "No such option"); the help shows it and no type placeholder such as <bool>."""
    examples = [
        line.strip() for line in (command.epilog or "").splitlines() if line.strip().startswith("or1 ")
    ]
    assert 1 <= len(examples) <= 2, f"or1 {' '.join(path)}: {examples}"
    shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and all(example in shown.output for example in examples), shown.output
    assert "<bool>" not in shown.output and "<list[str]>" not in shown.output, shown.output
    for example in examples:
        words = shlex.split(example)[1:]
        assert words[: len(path)] == path, example
        result = runner.invoke(app, [*words, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, (example, result.output)


@pytest.mark.parametrize(
    ("args", "note"),
    [
        (["score", "none.jsonl", "-o", "o.jsonl"], "note: --output is now --out"),
        (["score", "none.jsonl", "--output", "o.jsonl"], "note: --output is now --out"),
        (
            ["score", "none.jsonl", "--out", "o.jsonl", "--timeout", "3"],
            "note: --timeout is now --math-timeout",
        ),
        (
            ["eval", "no-such-benchmark", "--model", str(SHIPPED_BASE), "--fresh"],
            "note: --fresh is now --overwrite",
        ),
    ],
)
def test_an_old_flag_name_still_works_and_names_the_new_one(args, note, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert note in result.output and result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert "No such option" not in result.output


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
    result = runner.invoke(
        app, ["score", str(source), "--out", str(tmp_path / "out.parquet"), "--workers", "1"]
    )
    assert result.exit_code == 0, result.output
    scored = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(r["id"], r["score"], r["reason"]) for r in scored] == [
        (1, 1.0, "correct"),
        (2, 0.0, "wrong_answer"),
        (3, 0.0, "bad_input"),
        (4, 0.0, "no_answer"),
    ]


def test_score_missing_input_is_one_line(tmp_path):
    result = runner.invoke(app, ["score", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o.jsonl")])
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
