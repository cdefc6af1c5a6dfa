"""The step's perf/ rates and MFU from hand-made timings and a hand-made trained batch, the step line that shows
them, and the stage summary's medians."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from or1.algos.online_filter import PromptStats
from or1.compute.flops import forward_flops, training_flops
from or1.compute.peak import DevicePeak, table_tflops
from or1.config.recipe import resolve
from or1.config.schema import TrainerConfig
from or1.hybrid.batch import Batch
from or1.plan.model import ModelShape
from or1.run_metrics import devices_text
from or1.trainer.step_log import progress_line
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
    "perf/tokens_per_s": 15.0,
}
SEPARATE_TWO = [
    "rollout.placement=separate",
    "rollout.replicas=2",
    "algorithm.rollout_correction.is_level=token",
]
GENERATED = [(40, 30), (35, 30)]  # two rows: prompt + response 40 and 35 tokens, 30 response tokens each


def trained_batch() -> Batch:
    """Two rows: prompt 2 + response 3 tokens, prompt 1 + response 1 (left- and right-padded to 2 + 3)."""
    mask = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 0, 0]])
    return Batch({"attention_mask": mask, "responses": torch.zeros(2, 3, dtype=torch.long)})


def test_rates_shares_and_mfu_by_hand():
    peak = DevicePeak("cpu (2 threads)", 0.5, "measured")
    out = Throughput(devices=2, epochs=2, shape=SHAPE, peak=peak).metrics(TIMINGS, GENERATED, trained_batch())
    assert out["perf/generate_tokens_per_s"] == 30.0 and out["perf/generate_tokens_per_s_per_device"] == 15.0
    # 5 + 2 tokens, two epochs, in one second
    assert out["perf/update_tokens_per_s"] == 14.0 and out["perf/update_tokens_per_s_per_device"] == 7.0
    flops = 2 * training_flops(SHAPE, [5, 2], logits=4)  # a logit per response token: 3 + 1
    assert out["perf/update_tflops_per_device"] == pytest.approx(flops / 2 / 1e12)
    assert out["perf/update_mfu"] == pytest.approx(flops / 2 / 1e12 / 0.5)
    assert out["perf/peak_tflops_per_device"] == 0.5
    # colocated: the step ran on the same 2 devices; generation's forward over both rows, a logit per response token
    assert out["perf/tokens_per_s_per_device"] == 7.5
    generation = forward_flops(SHAPE, [40, 35], 60).total
    assert out["perf/step_mfu"] == pytest.approx((generation + flops) / 4.0 / 2 / 1e12 / 0.5)
    assert (out["perf/share_generate"], out["perf/share_reward"], out["perf/share_update"]) == (
        0.5,
        0.125,
        0.25,
    )
    assert out["perf/share_other"] == pytest.approx(0.125)  # the old-log-prob pass and the rest


def test_each_rate_divides_by_the_devices_that_did_its_work():
    """One training rank and two rollout replicas (the separate placement): generation over the 2 replicas, the
    update over the 1 rank, the whole step over all 3; the denominators from the recipe itself."""
    cfg = resolve("tiny", 1, [*SEPARATE_TWO, "trainer.devices_per_node=1"])
    assert (cfg.world_size, cfg.rollout_devices, cfg.step_devices) == (1, 2, 3)
    peak = DevicePeak("cpu (1 threads)", 0.5, "measured")
    t = replace(Throughput.of_stage(cfg, "/no/such/model", [peak]), shape=SHAPE)
    out = t.metrics(TIMINGS, GENERATED, trained_batch())
    assert out["perf/generate_tokens_per_s_per_device"] == 30.0 / 2
    assert out["perf/update_tokens_per_s_per_device"] == 7.0 / 1
    assert out["perf/update_tflops_per_device"] == pytest.approx(training_flops(SHAPE, [5, 2], 4) / 1e12)
    assert out["perf/tokens_per_s_per_device"] == 15.0 / 3
    step_flops = forward_flops(SHAPE, [40, 35], 60).total + training_flops(SHAPE, [5, 2], 4)
    assert out["perf/step_mfu"] == pytest.approx(step_flops / 4.0 / 3 / 1e12 / 0.5)
    assert t.facts()["rollout_devices"] == 2 and t.facts()["step_devices"] == 3
    assert devices_text(t.facts()) == "1 training + 2 rollout devices"
    # colocated: the training ranks sample too
    colocated = Throughput.of_stage(resolve("tiny", 1), "/no/such/model", [peak]).facts()
    assert devices_text(colocated) == "2 devices" and colocated["rollout_devices"] == 2
    # vLLM replicas of two devices each; the hf engine has no tensor parallelism
    vllm = ["rollout.engine=vllm", "rollout.tensor_parallel_size=2"]
    assert resolve("tiny", 1, [*SEPARATE_TWO, *vllm]).rollout_devices == 4
    assert resolve("tiny", 1, [*SEPARATE_TWO, "rollout.tensor_parallel_size=2"]).rollout_devices == 2


def test_without_peak_shape_or_update():
    bare = Throughput(devices=1).metrics(TIMINGS, GENERATED, trained_batch())
    assert "perf/update_tokens_per_s" in bare and "perf/update_tflops_per_device" not in bare
    assert "perf/step_mfu" not in bare
    with_shape = Throughput(devices=1, shape=SHAPE).metrics(TIMINGS, GENERATED, trained_batch())
    assert "perf/update_mfu" not in with_shape and "perf/step_mfu" not in with_shape
    skipped = Throughput(devices=1, shape=SHAPE).metrics({**TIMINGS, "time/update": 0.0}, GENERATED, None)
    assert "perf/update_tokens_per_s" not in skipped and skipped["perf/share_update"] == 0.0
    assert Throughput(devices=1).facts() == {"devices": 1, "rollout_devices": 1, "step_devices": 1}
    assert devices_text({"devices": 4}) == "4 devices"  # a summary from before the rollout count


def test_peak_of_the_stage_is_the_ranks_mean():
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
    summary = stage_summary(tmp_path, {"stage": 1, "device_peak": peak}, PromptStats(), TrainerConfig())
    assert summary["throughput"] == {
        "perf/generate_tokens_per_s": 200.0,  # the skipped step left out
        "perf/update_mfu": 0.02,
        "perf/share_generate": 0.5,
    }
    line = summary_lines(summary)[2]
    assert line.startswith("  median tok/s: generate 200 (2 devices), MFU 2.0% of 0.25 TFLOP/s per device")
    assert "(measured, cpu (1 threads)); step time: generate 50%" in line
