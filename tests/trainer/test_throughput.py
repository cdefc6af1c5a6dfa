"""The step's perf/ rates and MFU from hand-made timings and a hand-made trained batch, the step line that shows
them, and the stage summary's medians."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from or1.algos.online_filter import PromptStats
from or1.compute.flops import training_flops
from or1.compute.peak import DevicePeak, table_tflops
from or1.config.schema import HealthConfig
from or1.hybrid.batch import Batch
from or1.plan.model import ModelShape
from or1.trainer.step_log import PhaseTimer, progress_line
from or1.trainer.summary import stage_summary, summary_lines
from or1.trainer.throughput import Throughput

SHAPE = ModelShape.from_config(
    {
        "model_type": "qwen2",
        "vocab_size": 301,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
    }
)
TIMINGS = {
    "time/generate": 2.0,
    "time/reward": 0.5,
    "time/old_log_prob": 0.25,
    "time/update": 1.0,
    "time/step": 4.0,
}


def trained_batch() -> Batch:
    """Two rows: prompt 2 + response 3 tokens, prompt 1 + response 1 (left- and right-padded to 2 + 3)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    return Batch({"attention_mask": mask, "responses": torch.zeros(2, 3, dtype=torch.long)})


def test_rates_shares_and_mfu_by_hand():
    peak = DevicePeak("cpu (2 threads)", 0.5, "measured")
    out = Throughput(devices=2, epochs=2, shape=SHAPE, peak=peak).metrics(TIMINGS, 60.0, trained_batch())
    assert out["perf/generate_tokens_per_s"] == 30.0 and out["perf/generate_tokens_per_s_per_device"] == 15.0
    # 5 + 2 tokens, two epochs, in one second
    assert out["perf/update_tokens_per_s"] == 14.0 and out["perf/update_tokens_per_s_per_device"] == 7.0
    flops = 2 * training_flops(SHAPE, [5, 2], logits=4)  # a logit per response token: 3 + 1
    assert out["perf/update_tflops_per_device"] == pytest.approx(flops / 2 / 1e12)
    assert out["perf/update_mfu"] == pytest.approx(flops / 2 / 1e12 / 0.5)
    assert out["perf/peak_tflops_per_device"] == 0.5
    assert (out["perf/share_generate"], out["perf/share_reward"], out["perf/share_update"]) == (
        0.5,
        0.125,
        0.25,
    )
    assert out["perf/share_other"] == pytest.approx(0.125)  # the old-log-prob pass and the rest


def test_without_peak_shape_or_update():
    bare = Throughput(devices=1).metrics(TIMINGS, 60.0, trained_batch())
    assert "perf/update_tokens_per_s" in bare and "perf/update_tflops_per_device" not in bare
    assert "perf/update_mfu" not in Throughput(devices=1, shape=SHAPE).metrics(TIMINGS, 60.0, trained_batch())
    skipped = Throughput(devices=1, shape=SHAPE).metrics({**TIMINGS, "time/update": 0.0}, 60.0, None)
    assert "perf/update_tokens_per_s" not in skipped and skipped["perf/share_update"] == 0.0
    assert Throughput(devices=1).facts() == {"devices": 1}


def test_peak_of_the_stage_is_the_ranks_mean():
    from or1.config.recipe import resolve

    cfg = resolve(Path(__file__).resolve().parents[2] / "stages" / "tiny.yaml", 1)
    peaks = [DevicePeak("cpu (1 threads)", 0.2, "measured"), DevicePeak("cpu (1 threads)", 0.4, "measured")]
    t = Throughput.of_stage(cfg, "/no/such/model", peaks)
    assert t.shape is None and t.peak == DevicePeak("cpu (1 threads)", pytest.approx(0.3), "measured")
    assert t.devices == cfg.world_size and t.facts()["source"] == "measured"


def test_gpu_table_picks_the_most_specific_name():
    assert table_tflops("NVIDIA H100 80GB HBM3") == 989.5
    assert table_tflops("NVIDIA H100 PCIe") == 756.5
    assert table_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert table_tflops("NVIDIA A10G") == 125.0
    assert table_tflops("NVIDIA L40S") == 362.05 and table_tflops("NVIDIA L4") == 121.0
    assert table_tflops("Tesla V100-SXM2-16GB") is None  # no bf16 tensor cores: measured instead


def test_generated_tokens_add_up_over_sampling_rounds():
    timer = PhaseTimer()
    timer.add_tokens("generate", 40.0)
    timer.add_tokens("generate", 24.0)  # a refill round
    assert timer.tokens == {"generate": 64.0}


def test_step_line_shows_the_rates():
    m = {
        "batch/sampled": 8,
        "batch/kept": 8,
        **TIMINGS,
        "perf/tokens_per_s": 15.0,
        "perf/generate_tokens_per_s": 2360.4,
        "perf/update_tokens_per_s": 3100.0,
        "perf/update_mfu": 0.0123,
    }
    assert progress_line(3, 10, m).endswith("4.0s (gen 2.0s) 15 tok/s (gen 2360 upd 3100) mfu 1.2%")
    del m["perf/update_mfu"], m["perf/update_tokens_per_s"]
    assert progress_line(3, 10, m).endswith("15 tok/s (gen 2360)")


def test_summary_medians_and_peak(tmp_path: Path):
    rows = [
        {"step": 1, "batch/sampled": 8, "perf/generate_tokens_per_s": 100.0, "perf/update_mfu": 0.01},
        {"step": 2, "batch/sampled": 8, "skipped": 1.0, "perf/generate_tokens_per_s": 1.0},
        {"step": 3, "batch/sampled": 8, "perf/generate_tokens_per_s": 300.0, "perf/update_mfu": 0.03},
        {"step": 4, "batch/sampled": 8, "perf/generate_tokens_per_s": 200.0, "perf/share_generate": 0.5},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    peak = {"devices": 2, "device": "cpu (1 threads)", "tflops": 0.25, "source": "measured"}
    summary = stage_summary(tmp_path, {"stage": 1, "device_peak": peak}, PromptStats(), HealthConfig())
    assert summary["throughput"] == {
        "perf/generate_tokens_per_s": 200.0,  # the skipped step left out
        "perf/update_mfu": 0.02,
        "perf/share_generate": 0.5,
    }
    line = summary_lines(summary)[2]
    assert line.startswith("  median tok/s: generate 200 (2 devices), MFU 2.0% of 0.25 TFLOP/s per device")
    assert "(measured, cpu (1 threads)); step time: generate 50%" in line
