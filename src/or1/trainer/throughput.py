"""How fast a step went: tokens per second of generation and of the update (in all and per device), each phase's
share of the step, and the update's model FLOPs utilisation (MFU), under perf/ in every step's metrics.

The update's FLOPs are model FLOPs from the architecture (`or1.compute.flops`: forward + backward over each trained
sequence, causal attention per sequence, the output head at the response positions; ppo_epochs passes; activation
checkpointing's recompute and the old-log-prob pass left out), over the training ranks' peak (`or1.compute.peak`,
measured once per stage by the ranks). The devices are the training world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from or1.compute.flops import training_flops
from or1.compute.peak import DevicePeak
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import ATTENTION_MASK, RESPONSES
from or1.plan.model import ModelShape, read_model_shape
from or1.run_metrics import (
    GENERATE_TOKENS_PER_S,
    PEAK_TFLOPS_PER_DEVICE,
    STEP_SECONDS,
    UPDATE_MFU,
    UPDATE_TFLOPS_PER_DEVICE,
    UPDATE_TOKENS_PER_S,
    per_device,
    phase_seconds,
    phase_share,
)

# summary.json's medians (over trained steps) and the report's table, in this order
SHARES = ("generate", "reward", "update")  # phases with a perf/share_ of their own; the rest is "other"
MEDIANS = (
    GENERATE_TOKENS_PER_S,
    per_device(GENERATE_TOKENS_PER_S),
    UPDATE_TOKENS_PER_S,
    per_device(UPDATE_TOKENS_PER_S),
    UPDATE_TFLOPS_PER_DEVICE,
    UPDATE_MFU,
    *(phase_share(k) for k in (*SHARES, "other")),
)


@dataclass(frozen=True)
class Throughput:
    """What the rates need beyond a step's batch and timings: devices, their peak, the model's shape."""

    devices: int  # training ranks
    epochs: int = 1  # the update's passes over the batch (actor.ppo_epochs)
    shape: ModelShape | None = None  # None: no config.json to count FLOPs from
    peak: DevicePeak | None = None  # per device; None: no MFU

    @classmethod
    def of_stage(cls, cfg: RunConfig, model_path: str, peaks: list[DevicePeak]) -> Throughput:
        """From the ranks' own peaks (their mean, rank 0's name and source) and the start model's config.json."""
        try:
            shape = read_model_shape(model_path)
        except UserError:  # an architecture the count does not cover: the rates without FLOPs
            shape = None
        peak = None
        if peaks:
            mean = sum(p.tflops for p in peaks) / len(peaks)
            peak = DevicePeak(peaks[0].device, mean, peaks[0].source)
        return cls(devices=cfg.world_size, epochs=cfg.actor.ppo_epochs, shape=shape, peak=peak)

    def metrics(self, timings: dict[str, float], generated: float, trained: Batch | None) -> dict[str, float]:
        """perf/ rates of one step from its time/ metrics, the tokens it generated (all sampling rounds) and the
        batch the update trained on (None: a skipped step)."""
        step = timings.get(STEP_SECONDS, 0.0)
        out: dict[str, float] = {}
        generate = timings.get(phase_seconds("generate"), 0.0)
        if generate > 0:
            out[GENERATE_TOKENS_PER_S] = generated / generate
            out[per_device(GENERATE_TOKENS_PER_S)] = generated / generate / self.devices
        update = timings.get(phase_seconds("update"), 0.0)
        if trained is not None and update > 0:
            out.update(self.update_metrics(trained, update))
        if step > 0:
            shares = {k: timings.get(phase_seconds(k), 0.0) / step for k in SHARES}
            out.update({phase_share(k): v for k, v in shares.items()})
            out[phase_share("other")] = max(0.0, 1.0 - sum(shares.values()))
        return out

    def update_metrics(self, trained: Batch, seconds: float) -> dict[str, float]:
        mask = trained.tensors[ATTENTION_MASK]
        lengths = [int(n) for n in mask.sum(-1).tolist()]
        tokens = self.epochs * sum(lengths)
        out = {
            UPDATE_TOKENS_PER_S: tokens / seconds,
            per_device(UPDATE_TOKENS_PER_S): tokens / seconds / self.devices,
        }
        if self.shape is None:
            return out
        # one logit per response token (the engines' logits_to_keep)
        logits = int(mask[:, -trained.tensors[RESPONSES].shape[1] :].sum())
        flops = self.epochs * training_flops(self.shape, lengths, logits)
        out[UPDATE_TFLOPS_PER_DEVICE] = flops / seconds / self.devices / 1e12
        if self.peak is not None:
            out[UPDATE_MFU] = out[UPDATE_TFLOPS_PER_DEVICE] / self.peak.tflops
            out[PEAK_TFLOPS_PER_DEVICE] = self.peak.tflops
        return out

    def facts(self) -> dict[str, Any]:
        """summary.json's `device_peak`: the peak MFU divided by and where it came from."""
        if self.peak is None:
            return {"devices": self.devices}
        return {
            "devices": self.devices,
            "device": self.peak.device,
            "tflops": self.peak.tflops,
            "source": self.peak.source,
        }
