"""run_eval with a fake sampler: outputs, caching, resume after a crash or a SIGKILL, fingerprint checks."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from or1.data.rows import make_row, write_rows
from or1.errors import UserError
from or1.eval import evaluate
from or1.eval.evaluate import run_eval
from or1.eval.generation import Completion
from or1.eval.results import model_fingerprint
from or1.report.compare import provenance


def math_rows(count: int) -> list[dict]:
    return [
        make_row(
            data_source="t",
            prompt=[{"role": "user", "content": f"Compute {i}+1."}],
            ability="math",
            ground_truth=[str(i + 1)],
            extra_info={"index": i},
        )
        for i in range(count)
    ]


class FakeSampler:
    """Boxes the right answer or a wrong one depending on each sample's seed: deterministic, mixed outcomes."""

    def __init__(self, fail_on_call: int | None = None):
        self.calls = 0
        self.prompts = 0
        self.fail_on_call = fail_on_call

    def __call__(self, prompts: list, seeds: list[int]) -> list[Completion]:
        self.calls += 1
        if self.calls == self.fail_on_call:
            raise RuntimeError("simulated crash")
        self.prompts += len(prompts)
        out = []
        for messages, seed in zip(prompts, seeds, strict=True):
            value = int(messages[0]["content"].split()[1].rstrip(".").split("+")[0]) + 1
            answer = value if seed % 2 == 0 else value + 1
            out.append(Completion(f"so \\boxed{{{answer}}}", 5, False))
        return out


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"weights")
    data = write_rows(tmp_path / "rows.parquet", math_rows(3))
    sampler = FakeSampler()
    monkeypatch.setattr(evaluate, "load_sampler", lambda *a: sampler)
    return {
        "model": model,
        "data": data,
        "out": tmp_path / "out",
        "sampler": sampler,
        "monkeypatch": monkeypatch,
    }


def run(s: dict, **kwargs) -> Path:
    args = {
        "model": s["model"],
        "n": 4,
        "data": s["data"],
        "out": s["out"],
        "max_tokens": 16,
        "batch_size": 5,
        "show_progress": False,
        "workers": 1,
    }
    return run_eval("aime24", **{**args, **kwargs})


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()[1:]]


def test_outputs_and_summary(setup: dict) -> None:
    out = run(setup)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"]["sha256"] == model_fingerprint(setup["model"])["sha256"]
    assert summary["data"]["num_problems"] == 3 and len(summary["data"]["sha256"]) == 64
    assert summary["sampling"] == {
        "protocol": "skywork",
        "n": 4,
        "temperature": 1.0,
        "top_p": 1.0,
        "max_tokens": 16,
        "seed": 0,
        "overridden": ["n", "max_tokens"],
    }
    assert summary["environment"]["or1"] and summary["started_at"] <= summary["finished_at"]
    saved = records(out)
    assert len(saved) == 12 and {r["reason"] for r in saved} <= {"correct", "wrong_answer"}
    correct = sum(r["reason"] == "correct" for r in saved)
    assert summary["metrics"]["estimates"]["avg@4"]["value"] == pytest.approx(correct / 12)
    assert "maj@4" in summary["metrics"]["estimates"]
    report = (out / "report.md").read_text()
    assert "| avg@4 |" in report and report.count("/4 |") == 3
    # everything that decides whether two results compare is recorded (or1 report A B reads it)
    settings = provenance(summary)
    assert None not in settings.values() and settings["engine_version"].startswith("transformers ")
    assert "## Provenance" in report and "| temperature | 1.0 | yes |" in report
    assert summary["layout"]["replicas"] == 1 and summary["seeding"].startswith("per sample")


def test_a_crashed_run_resumes_without_regenerating(setup: dict) -> None:
    setup["sampler"].fail_on_call = 2
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(setup)
    first = records(setup["out"])
    assert len(first) == 5  # the first batch was scored and flushed before the crash
    resumed = FakeSampler()
    setup["monkeypatch"].setattr(evaluate, "load_sampler", lambda *a: resumed)
    out = run(setup)
    assert resumed.prompts == 12 - 5
    assert records(out)[:5] == first
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["samples_reused"], summary["samples_generated"]) == (5, 7)


def test_a_complete_cache_loads_no_model_and_more_samples_extend_it(setup: dict) -> None:
    run(setup)
    setup["monkeypatch"].setattr(
        evaluate, "load_sampler", lambda *a: pytest.fail("model loaded for a cached run")
    )
    run(setup)
    more = FakeSampler()
    setup["monkeypatch"].setattr(evaluate, "load_sampler", lambda *a: more)
    run(setup, n=6)
    assert more.prompts == 6


def test_changed_settings_refuse_the_cache_unless_overwrite(setup: dict) -> None:
    run(setup)
    with pytest.raises(UserError, match="temperature.*--overwrite"):
        run(setup, temperature=0.6)
    fresh = FakeSampler()
    setup["monkeypatch"].setattr(evaluate, "load_sampler", lambda *a: fresh)
    run(setup, temperature=0.6, overwrite=True)
    assert fresh.prompts == 12


@pytest.mark.parametrize("smaller", [{"max_problems": 2}, {"n": 2}])
def test_a_complete_evaluation_is_not_replaced_by_a_smaller_one_without_overwrite(
    setup: dict, smaller: dict
) -> None:
    """`--limit 8` (or a smaller --n) into a folder holding a complete evaluation used to replace its summary.json
    and report.md with the smaller one's; it is refused, before anything is sampled, unless --overwrite."""
    out = run(setup)
    before = {name: (out / name).read_text() for name in ("summary.json", "report.md", "samples.jsonl")}
    with pytest.raises(
        UserError, match=r"holds a complete evaluation of 3 problems x 4 samples.*--overwrite"
    ):
        run(setup, **smaller)
    assert {name: (out / name).read_text() for name in before} == before
    setup["sampler"].fail_on_call = (
        setup["sampler"].calls + 1
    )  # started over, then stopped: no old summary left
    with pytest.raises(RuntimeError, match="simulated crash"):
        run(setup, **smaller, overwrite=True)
    assert not (out / "summary.json").exists() and not (out / "report.md").exists()
    setup["sampler"].fail_on_call = None
    run(setup, **smaller)  # the rerun (the resume line drops --overwrite) finishes the smaller evaluation
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["data"]["num_problems"], summary["sampling"]["n"]) == (
        smaller.get("max_problems", 3),
        smaller.get("n", 4),
    )


def test_a_partial_last_line_is_dropped(setup: dict) -> None:
    run(setup, n=2)
    path = setup["out"] / "samples.jsonl"
    path.write_text(path.read_text() + '{"problem_id": "0000-')  # killed mid-write
    run(setup, n=2)
    assert len(records(setup["out"])) == 6


SIGKILL_SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    from or1.eval import evaluate
    from or1.eval.generation import Completion

    calls = []
    def sampler(prompts, seeds):
        calls.append(len(prompts))
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return [Completion("\\\\boxed{0}", 3, False) for _ in prompts]

    evaluate.load_sampler = lambda *a: sampler
    evaluate.run_eval("aime24", model=Path(sys.argv[1]), data=Path(sys.argv[2]), out=Path(sys.argv[3]), n=4,
                    max_tokens=8, batch_size=4, show_progress=False, workers=1)
    """
)


def test_a_sigkilled_run_resumes(setup: dict) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(evaluate.__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, "-c", SIGKILL_SCRIPT, str(setup["model"]), str(setup["data"]), str(setup["out"])],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    assert len(records(setup["out"])) == 4
    assert not (setup["out"] / "summary.json").exists()
    out = run(setup, max_tokens=8, batch_size=4)
    assert setup["sampler"].prompts == 8
    assert len(records(out)) == 12


def test_vllm_engine_without_vllm_names_the_extra(setup: dict) -> None:
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    setup["monkeypatch"].undo()
    with pytest.raises(UserError, match="vllm extra"):
        run(setup, engine="vllm")


def test_unknown_engine_and_bad_limit(setup: dict) -> None:
    with pytest.raises(UserError, match="engine"):
        run(setup, engine="tpu")
    with pytest.raises(UserError, match="limit"):
        run(setup, max_problems=0)


def test_default_out_follows_the_run_layout_and_never_mixes_two_models() -> None:
    import hashlib

    from or1.eval.evaluate import default_out

    assert default_out(Path("runs/exp1/stage2/final"), "aime24") == Path("runs/exp1/eval/stage2-final/aime24")
    assert default_out(Path("runs/exp1/stage1/final"), "aime24") == Path("runs/exp1/eval/stage1-final/aime24")
    digest = hashlib.sha256(b"/models/DeepSeek-R1-Distill-Qwen-7B").hexdigest()[:8]
    assert default_out(Path("/models/DeepSeek-R1-Distill-Qwen-7B/"), "aime24") == Path(
        f"runs/eval/DeepSeek-R1-Distill-Qwen-7B-{digest}/aime24"
    )
    # two folders both called `final` (say, from two experiments) get two caches
    assert default_out(Path("/a/final"), "aime24") != default_out(Path("/b/final"), "aime24")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_saves_the_batch_in_progress_and_stops(setup: dict, signum: int) -> None:
    """The signal arrives during the second batch: that batch is still scored and saved, then the run stops with
    Interrupted (the CLI's exit 130 / 143), and a rerun generates only the missing samples."""
    from or1.stop import Interrupted

    sampler = setup["sampler"]
    real = FakeSampler.__call__

    def signalled(self: FakeSampler, prompts: list, seeds: list[int]) -> list[Completion]:
        if self.calls == 1:  # the second call
            os.kill(os.getpid(), signum)
        return real(self, prompts, seeds)

    setup["monkeypatch"].setattr(FakeSampler, "__call__", signalled)
    with pytest.raises(Interrupted, match=r"stopped after 10 of 12 samples") as stop:
        run(setup)
    assert stop.value.exit_code == 128 + signum
    assert sampler.calls == 2 and len(records(setup["out"])) == 10  # both batches of 5 kept
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # pytest's handler is back
    resumed = FakeSampler()
    setup["monkeypatch"].setattr(evaluate, "load_sampler", lambda *a: resumed)
    setup["monkeypatch"].setattr(FakeSampler, "__call__", real)
    run(setup)
    assert resumed.prompts == 2 and len(records(setup["out"])) == 12


def test_replicas_zero_is_refused_before_anything_is_written(setup: dict) -> None:
    """--replicas 0 was refused only once sampling started, leaving a header-only samples.jsonl in --out."""
    with pytest.raises(UserError, match="--replicas .* at least 1"):
        run(setup, replicas=0)
    assert not setup["out"].exists()


SHIPPED_BASE = Path(evaluate.__file__).parents[1] / "tinyworld" / "tiny-base"


def eval_file(tmp_path: Path, rows: list[dict] | None, name: str = "rows.parquet") -> str:
    """`or1 eval FILE --model <the shipped tiny base>`: the one-line error it ends with (exit 2)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from or1.cli import app

    path = tmp_path / name
    if rows is None:  # the right schema, no rows
        pq.write_table(pa.Table.from_pylist(math_rows(1)).slice(0, 0), path)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    else:
        write_rows(path, rows)
    result = CliRunner().invoke(
        app, ["eval", str(path), "--model", str(SHIPPED_BASE), "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert not (tmp_path / "o").exists()
    return " ".join(result.output.split())


def test_an_or1_row_file_without_reward_model_names_the_column_and_prepare_data(tmp_path: Path) -> None:
    rows = [{k: v for k, v in row.items() if k != "reward_model"} for row in math_rows(2)]
    error = eval_file(tmp_path, rows)
    assert "'reward_model'" in error and "or1 prepare-data" in error and "'problem'" not in error


def test_an_empty_file_of_or1_rows_says_0_rows(tmp_path: Path) -> None:
    assert f"0 rows in {tmp_path / 'rows.parquet'}" in eval_file(tmp_path, None)
    assert f"0 rows in {tmp_path / 'empty.jsonl'}" in eval_file(tmp_path, [], "empty.jsonl")


def test_a_question_answer_file_is_not_or1_rows_and_prepare_data_turns_it_into_rows(tmp_path: Path) -> None:
    error = eval_file(tmp_path, [{"question": "1+1?", "answer": "2"}], "qa.jsonl")
    assert "not a file of or1 rows" in error and "or1 prepare-data turns it into rows" in error


def test_or1_eval_ends_with_its_headline(setup: dict) -> None:
    """Each metric with its interval and where the report is (it used to print only 'wrote ... report.md')."""
    from typer.testing import CliRunner

    from or1.cli import app

    args = ["eval", "aime24", "--model", str(SHIPPED_BASE), "--data", str(setup["data"]), "--n", "4"]
    result = CliRunner().invoke(
        app, [*args, "--max-tokens", "16", "--workers", "1", "--out", str(setup["out"])]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((setup["out"] / "summary.json").read_text())
    lines = result.output.splitlines()
    for name, est in summary["metrics"]["estimates"].items():
        if name != "pass@1":  # the same number as avg@4, shown once as "avg@4 (= pass@1)"
            shown = f"{100 * est['value']:.1f}%  95% CI {100 * est['ci_low']:.1f}-{100 * est['ci_high']:.1f}"
            assert any(line.split()[:1] == [name] and shown in line for line in lines), (name, result.output)
    assert "avg@4 (= pass@1)" in result.output and "aime24: 3 problems x 4 samples" in result.output
    assert f"report: {setup['out'] / 'report.md'}" in result.output
