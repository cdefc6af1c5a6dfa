"""`or1 report` on hand-made run directories: every figure of a finished run, what it can of a half-finished one,
numbers in report.md computed by hand, and no trainer or worker code imported."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from typer.testing import CliRunner

from or1.cli import app
from or1.data.rows import make_row, write_rows
from or1.report import refresh_report, write_report
from or1.report.runfiles import read_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_FIGURES = {"validation", "reward", "response_length", "truncation", "entropy", "rejection", "step_time"}
VAL = "val/validation/t1/avg@5"


def step_record(step: int, reward: float, **extra: float) -> dict:
    return {
        "step": step,
        "reward/mean": reward,
        "batch/sampled": 128.0,
        "batch/rejected_frac": 0.25,
        "reward/solve_all_frac": 0.15,
        "reward/solve_none_frac": 0.10,
        "response/length_mean": 30.0 + step,
        "response/length_max": 45.0,
        "response/truncated_frac": 0.05,
        "actor/entropy": 0.3,
        "entropy/entropy": 0.1,
        "entropy/target": 0.09,
        "entropy/coef": 0.001 * step,
        "time/generate": 1.0,
        "time/reward": 0.2,
        "time/old_log_prob": 0.1,
        "time/update": 0.5,
        "time/step": 2.0,
        **extra,
    }


def write_stage(
    run: Path,
    index: int,
    steps: int,
    budget: int,
    rewards: list[float],
    val: tuple[float, float] | None,
    *,
    finished: bool = True,
    dropped: dict | None = None,
    advantage: str = "grpo",
    recipe_start: int = 250,
) -> None:
    """stage<index>/ with config.yaml, metrics.jsonl (step-0 validation, one record per reward) and summary.json."""
    folder = run / f"stage{index}"
    folder.mkdir(parents=True)
    config = {
        "recipe": "tiny",
        # the recipe's start step (250 per stage) is not what ran: offsets follow trainer.steps of earlier stages
        "stage": {"index": index, "name": str(index), "start_step": recipe_start * (index - 1)},
        "data": {"validation": {"max_response_length": 96}},
        "rollout": {"max_response_length": budget},
        "algorithm": {"advantage": advantage},
        "trainer": {"steps": steps},
    }
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    records = []
    if val is not None:
        records.append({"step": 0, VAL: val[0], "val/validation/t1/truncated_frac": 0.1})
    for step, reward in enumerate(rewards, 1):
        extra = {"critic/vf_loss": 1.0 / step} if advantage == "gae" else {}
        if val is not None and step == steps:
            extra |= {VAL: val[1], "val/validation/t1/truncated_frac": 0.02}
        records.append(step_record(step, reward, **extra))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if finished:
        summary = {
            "recipe": "tiny",
            "stage": index,
            "train_prompts": 400,
            "online_filter_dropped": dropped or {},
        }
        (folder / "summary.json").write_text(json.dumps(summary))


def write_eval(run: Path, label: str, value: float, benchmark: str = "validation") -> None:
    folder = run / "eval" / label
    folder.mkdir(parents=True)
    summary = {
        "benchmark": benchmark,
        "model": {"path": f"/models/{label}"},
        "sampling": {"max_tokens": 96},
        "metrics": {
            "samples_per_problem": 4,
            "estimates": {"avg@4": {"value": value, "ci_low": value - 0.05, "ci_high": value + 0.05}},
        },
    }
    (folder / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def finished_run(tmp_path: Path) -> Path:
    run = tmp_path / "runs" / "tiny"
    write_stage(run, 1, 10, 48, [0.1] * 5 + [0.3] * 5, (0.40, 0.50))
    write_stage(run, 2, 4, 64, [0.4, 0.4, 0.6, 0.6], (0.50, 0.55), dropped={"stage1": 12})
    write_stage(run, 3, 4, 96, [0.5, 0.6, 0.7, 0.8], (0.55, 0.61), dropped={"stage1": 12, "stage2": 30})
    write_eval(run, "final", 0.6)
    write_eval(run, "base", 0.4)
    return run


def is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_finished_run_gets_every_figure_and_the_numbers(finished_run: Path) -> None:
    report = write_report(finished_run)
    assert set(report.figures) == STEP_FIGURES | {"online_filter", "eval", "overview"}
    assert report.missing == []  # the value loss is a GAE figure: not missing from a GRPO run
    assert all(is_png(p) and p.parent == finished_run / "plots" for p in report.figures.values())
    text = report.markdown.read_text()
    # Stage 1: rewards 0.1 x5 then 0.3 x5, first and last tenth (1 step each); 25% rejected; coef at step 10.
    assert (
        "| 1 | 10 of 10 | 48 | validation/t1/avg@5 40.0 -> 50.0 | 0.10 -> 0.30 | 25% | 0.0100 | - | 0.3 |"
        in text
    )
    assert (
        "| 3 | 4 of 4 | 96 | validation/t1/avg@5 55.0 -> 61.0 | 0.50 -> 0.80 | 25% | 0.0040 | 42 | 0.1 |"
        in text
    )
    # Evaluations: base before final whatever the folder order, with their intervals.
    assert text.index("| base | validation | 4 | 96 | avg@4 | 40.0 | 35.0 - 45.0 |") < text.index("| final |")
    assert "![Validation accuracy](plots/validation.png)" in text


def test_the_report_lists_each_stage_s_advisories(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_stage(run, 1, 10, 48, [0.1] * 10, (0.40, 0.50))
    write_stage(run, 2, 100, 64, [0.4, 0.5], (0.50, 0.0), finished=False)
    summary = json.loads((run / "stage1" / "summary.json").read_text())
    advisory = {
        "rule": "truncation",
        "step": 7,
        "metric": "response/truncated_frac",
        "value": 0.31,
        "advice": "a",
    }
    (run / "stage1" / "summary.json").write_text(json.dumps(summary | {"advisories": [advisory]}))
    text = write_report(run).markdown.read_text()
    assert "## Run health" in text
    assert "- 1, step 7: `response/truncated_frac` = 0.31: a" in text
    assert "- 2: running or interrupted" in text


def test_one_step_axis_across_stages(finished_run: Path) -> None:
    run = read_run(finished_run)
    # Offsets follow the steps each earlier stage ran (10, then 4), not the recipe's start_step (250, 500).
    assert [(s.offset, s.end) for s in run.stages] == [(0, 10), (10, 14), (14, 18)]
    assert run.stages[1].series(VAL) == ([10, 14], [0.50, 0.55])
    assert run.stages[2].series("reward/mean")[0] == [15, 16, 17, 18]


def test_half_finished_run_gets_what_it_can(tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_stage(run, 1, 10, 48, [0.1] * 10, (0.40, 0.50))
    write_stage(run, 2, 100, 64, [0.4, 0.5], (0.50, 0.0), finished=False)  # 2 of 100 steps, no summary yet
    with (run / "stage2" / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward/me')  # the line being written when the report reads the file
    report = write_report(run)
    assert STEP_FIGURES | {"online_filter", "overview"} == set(report.figures)
    assert report.missing == ["eval"]
    text = report.markdown.read_text()
    assert "| 2 (running or interrupted) | 2 of 100 | 64 | validation/t1/avg@5 50.0 -> 50.0 |" in text
    assert "Not drawn, nothing logged for them (yet): eval." in text
    # A stage that has written only its config (workers starting) and no eval: still a report.
    write_stage(tmp_path / "fresh", 1, 10, 48, [], None, finished=False)
    fresh = write_report(tmp_path / "fresh")
    assert fresh.figures == {} and "validation" in fresh.missing


def test_gae_run_adds_the_value_loss(tmp_path: Path) -> None:
    run = tmp_path / "gae"
    write_stage(run, 1, 6, 48, [0.2] * 6, (0.4, 0.45), advantage="gae")
    assert "value_loss" in write_report(run).figures


def test_a_run_with_mismatch_metrics_draws_the_sampler_gap(tmp_path: Path) -> None:
    run = tmp_path / "mismatch"
    write_stage(run, 1, 6, 48, [0.2] * 6, (0.4, 0.45))
    metrics = run / "stage1" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for row in rows:
        row.update({"mismatch/abs_diff_mean": 1e-3, "mismatch/abs_diff_max": 0.2, "mismatch/k3_kl": 3e-5})
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert "mismatch" in write_report(run).figures


def test_cli_report_and_its_user_error(finished_run: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    done = runner.invoke(app, ["report", str(finished_run)])
    assert done.exit_code == 0, done.output
    assert "report.md" in done.output and (finished_run / "plots" / "overview.png").is_file()
    empty = tmp_path / "empty"
    empty.mkdir()
    failed = runner.invoke(app, ["report", str(empty)])
    assert failed.exit_code == 2
    assert "has no stage<N>/ or eval/ folder" in failed.output


def test_report_reads_files_without_importing_trainer_or_workers(finished_run: Path) -> None:
    code = (
        "import sys; from or1.report import write_report; write_report(sys.argv[1]); "
        "print(sorted(m for m in sys.modules if m.startswith(('or1.trainer', 'or1.workers', 'or1.hybrid', 'ray'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(finished_run)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_train_refreshes_the_report_without_failing_the_stage(finished_run: Path, tmp_path: Path) -> None:
    out = io.StringIO()
    refresh_report(finished_run, Console(file=out, width=1000))
    assert f"report: {finished_run / 'report.md'} (10 figures)" in out.getvalue()
    refresh_report(tmp_path / "nothing here", Console(file=out, width=1000))  # printed, not raised
    assert "or1 report" in out.getvalue() and "is not a directory" in out.getvalue()


def test_evals_in_pipeline_order(finished_run: Path) -> None:
    write_eval(finished_run, "stage2-final/validation", 0.55)  # or1 eval's default folder for stage 2's model
    write_eval(finished_run, "stage1", 0.5)
    labels = [e.label for e in read_run(finished_run).evals]
    assert labels == ["base", "stage1", "stage2-final/validation", "final"]
    assert read_run(finished_run).evals[0].estimates == {"avg@4": pytest.approx((0.4, 0.35, 0.45))}


def test_each_benchmark_gain_from_base_to_final(finished_run: Path) -> None:
    write_eval(finished_run, "base-code", 0.24, "livecodebench")
    write_eval(finished_run, "final-code", 0.375, "livecodebench")
    report = write_report(finished_run)
    assert report.gains == [
        "validation, base -> final: avg@4 40.0% -> 60.0% (+20.0 points)",
        "livecodebench, base -> final: avg@4 24.0% -> 37.5% (+13.5 points)",
    ]
    assert f"- {report.gains[1]}" in report.markdown.read_text()


def test_throughput_table_and_figure(tmp_path: Path) -> None:
    run = tmp_path / "perf"
    write_stage(run, 1, 3, 48, [0.2] * 3, None)
    metrics = run / "stage1" / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    for row, rate in zip(rows, (100.0, 300.0, 200.0), strict=True):
        row.update(
            {
                "perf/generate_tokens_per_s": rate,
                "perf/generate_tokens_per_s_per_device": rate / 2,
                "perf/update_tokens_per_s": 2 * rate,
                "perf/update_tokens_per_s_per_device": rate,
                "perf/update_tflops_per_device": 0.01,
                "perf/update_mfu": 0.04,
                "perf/peak_tflops_per_device": 0.25,
                "perf/share_generate": 0.5,
                "perf/share_reward": 0.1,
                "perf/share_update": 0.25,
                "perf/share_other": 0.15,
                "perf/step_mfu": 0.02,
            }
        )
    metrics.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = write_report(run)
    assert "throughput" in report.figures and is_png(report.figures["throughput"])
    text = report.markdown.read_text()
    # medians over the 3 steps; the peak is the logged one until summary.json names its source and the devices
    assert "| 1 | - | 200 (100) | 400 (200) | 0.01 | 4.0% | 2.0% | 0.25 | 50% / 10% / 25% / 15% |" in text
    summary = json.loads((run / "stage1" / "summary.json").read_text())
    summary["device_peak"] = {
        "devices": 2,
        "rollout_devices": 4,
        "step_devices": 6,
        "device": "NVIDIA H100 80GB HBM3",
        "tflops": 989.5,
        "source": "table",
    }
    (run / "stage1" / "summary.json").write_text(json.dumps(summary))
    text = write_report(run).markdown.read_text()
    assert "| 1 | 2 training + 4 rollout devices | 200 (100) |" in text
    assert "| 0.01 | 4.0% | 2.0% | 989.5 (datasheet, NVIDIA H100 80GB HBM3) |" in text


def drawn(run_dir: Path, name: str):
    """The figure of panel `name`, drawn as `or1 report` draws it, and its axes (the artists to inspect)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from or1.report.figures import OTHER_PANELS, STEP_PANELS, _finish

    panel = next(p for p in (*STEP_PANELS, *OTHER_PANELS) if p.name == name)
    run = read_run(run_dir)
    fig = Figure(figsize=(8, 4.2), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    assert panel.draw(ax, run)
    _finish(ax, panel, run)
    fig.canvas.draw()
    return fig, ax


def test_the_eval_figure_puts_the_models_side_by_side_per_estimate_with_nothing_overlapping(
    tmp_path: Path,
) -> None:
    """eval.png had its numbers running into each other, an avg@4 and a pass@1 bar of the same value, and base and
    final apart (all of base's bars, then all of final's)."""
    run = tmp_path / "runs" / "x"
    for label, value in (("base", 0.9), ("stage1", 0.95), ("final", 0.97)):
        for benchmark, names in (("validation", MATH_NAMES), ("livecodebench", CODE_NAMES)):
            folder = run / "eval" / label / benchmark  # or1 eval's folder for a run's model
            folder.mkdir(parents=True)
            estimates = {n: {"value": value, "ci_low": value - 0.1, "ci_high": 1.0} for n in names}
            summary = {"benchmark": benchmark, "model": {"path": label}, "metrics": {"estimates": estimates}}
            (folder / "summary.json").write_text(json.dumps(summary))
    fig, ax = drawn(run, "eval")
    shown = [t.get_text() for t in ax.get_xticklabels()]
    # each benchmark's estimates once; pass@1 is avg@4's number
    assert sorted(shown) == sorted(n for n in (*MATH_NAMES, *CODE_NAMES) if n != "pass@1")
    from matplotlib.container import BarContainer

    bars = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [c.get_label() for c in bars] == ["base", "stage1", "final"]
    # per estimate, the three models' bars next to each other, in pipeline order
    xs = [[bar.get_x() for bar in container.patches] for container in bars]
    for group in range(len(shown)):
        at = [x[group] for x in xs]
        assert at == sorted(at) and at[-1] - at[0] < 0.9 and group - 0.5 < at[0] < at[-1] < group + 0.5
    renderer = fig.canvas.get_renderer()
    texts = [t for t in ax.texts if t.get_text()] + ax.get_legend().get_texts() + [ax.title]
    boxes = [t.get_window_extent(renderer) for t in texts]
    for i, a in enumerate(boxes):
        for j in range(i + 1, len(boxes)):
            assert not a.overlaps(boxes[j]), (texts[i].get_text(), texts[j].get_text())


MATH_NAMES = ("avg@4", "pass@1", "pass@2", "pass@4", "first@1", "maj@4")
CODE_NAMES = ("avg@4", "pass@1", "pass@4", "first@1")


def test_validation_curves_say_what_they_measure_and_a_flat_coefficient_why(tmp_path: Path) -> None:
    """The validation legend named sets by their file ("validation T=1 avg@5"); a set file readable from here is
    named by its rows' ability. An entropy coefficient that never moved was drawn without a word."""
    run = tmp_path / "runs" / "tiny"
    write_stage(run, 1, 4, 48, [0.2] * 4, (0.4, 0.5))
    data = tmp_path / "validation.parquet"
    write_rows(
        data,
        [
            make_row(
                data_source="v",
                prompt=[{"role": "user", "content": "1+1?"}],
                ability="math",
                ground_truth=["2"],
                extra_info={"index": 0},
            )
        ],
    )
    config = yaml.safe_load((run / "stage1" / "config.yaml").read_text())
    config["data"]["validation"]["sets"] = [str(data)]
    config["algorithm"]["entropy"] = {"mode": "adaptive", "target": 0.065}
    (run / "stage1" / "config.yaml").write_text(yaml.safe_dump(config))
    metrics = run / "stage1" / "metrics.jsonl"
    records = [json.loads(line) | {"entropy/coef": 0.0} for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    _, ax = drawn(run, "validation")
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["math (validation): avg@5 at T=1"]
    _, ax = drawn(run, "entropy")
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "coefficient (right axis),\nflat at 0: entropy never fell below its target 0.065" in legend
