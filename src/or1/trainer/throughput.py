"""How fast a step went: tokens per second of generation and of the update (in all and per device), each phase's
share of the step, the update's model FLOPs utilisation (MFU) and the whole step's, under perf/ in every step's
metrics.

Each rate is divided by the devices that did its work: generation by the rollout devices (the training ranks when
colocated; the replicas' own under the separate placement), the update by the training ranks, the whole step
(`perf/tokens_per_s`, `perf/step_mfu`) by every device the step used (both kinds under the separate placement).

FLOPs are model FLOPs from the architecture (`or1.compute.flops`): the update's forward + backward over each trained
sequence (causal attention per sequence, the output head at the response positions, ppo_epochs passes; activation
checkpointing's recompute and the old-log-prob pass left out), and generation's forward over every sampled sequence
(prompt and response, a logit per response token: what a KV-cached decode computes). The peak is the training ranks'
(`or1.compute.peak`, measured once per stage by the ranks); the step's MFU takes it for the replicas' devices too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from or1.compute.flops import forward_flops, training_flops
from or1.compute.peak import DevicePeak
from or1.config.schema import RunConfig
from or1.errors import UserError
from or1.hybrid.batch import Batch
from or1.hybrid.columns import ATTENTION_MASK, RESPONSES
from or1.plan.model import ModelShape, read_model_shape
from or1.run_metrics import (
    GENERATE_TOKENS_PER_S,
    PEAK_TFLOPS_PER_DEVICE,
    STEP_MFU,
    STEP_SECONDS,
    TOKENS_PER_S,
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
    per_device(TOKENS_PER_S),
    STEP_MFU,
    *(phase_share(k) for k in (*SHARES, "other")),
)


@dataclass(frozen=True)
class Throughput:
    """What the rates need beyond a step's batch and timings: devices, their peak, the model's shape."""

    devices: int  # training ranks
    rollout_devices: int | None = None  # the devices that sample; None: the training ranks (colocated)
    step_devices: int | None = None  # every device a step uses; None: the training ranks (colocated)
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
        return cls(
            devices=cfg.world_size,
            rollout_devices=cfg.rollout_devices,
            step_devices=cfg.step_devices,
            epochs=cfg.actor.ppo_epochs,
            shape=shape,
            peak=peak,
        )

    def metrics(
        self, timings: dict[str, float], generated: list[tuple[int, int]], trained: Batch | None
    ) -> dict[str, float]:
        """perf/ rates of one step from its time/ metrics and perf/tokens_per_s, the rows it generated (each one's
        prompt + response and response tokens, all sampling rounds) and the batch the update trained on (None: a
        skipped step)."""
        step = timings.get(STEP_SECONDS, 0.0)
        step_devices = self.step_devices or self.devices
        out: dict[str, float] = {}
        generate = timings.get(phase_seconds("generate"), 0.0)
        if generate > 0:
            rate = sum(response for _, response in generated) / generate
            out[GENERATE_TOKENS_PER_S] = rate
            out[per_device(GENERATE_TOKENS_PER_S)] = rate / (self.rollout_devices or self.devices)
        update = timings.get(phase_seconds("update"), 0.0)
        trained = trained if update > 0 else None
        update_flops = self.update_flops(trained) if trained is not None and self.shape is not None else 0.0
        if trained is not None:
            out.update(self.update_metrics(trained, update, update_flops))
        if step > 0:
            shares = {k: timings.get(phase_seconds(k), 0.0) / step for k in SHARES}
            out.update({phase_share(k): v for k, v in shares.items()})
            out[phase_share("other")] = max(0.0, 1.0 - sum(shares.values()))
            if TOKENS_PER_S in timings:
                out[per_device(TOKENS_PER_S)] = timings[TOKENS_PER_S] / step_devices
            if self.shape is not None and self.peak is not None:
                sequences = [length for length, _ in generated]
                responses = sum(response for _, response in generated)
                flops = forward_flops(self.shape, sequences, responses).total + update_flops
                out[STEP_MFU] = flops / step / step_devices / 1e12 / self.peak.tflops
        return out

    def update_flops(self, trained: Batch) -> float:
        """The update's model FLOPs, one logit per response token (the engines' logits_to_keep), every epoch."""
        assert self.shape is not None, "no model shape to count FLOPs from"
        lengths = [int(n) for n in trained.tensors[ATTENTION_MASK].sum(-1).tolist()]
        return self.epochs * training_flops(self.shape, lengths, response_tokens(trained))

    def update_metrics(self, trained: Batch, seconds: float, flops: float) -> dict[str, float]:
        """The update's rates: tokens per second, and with a model shape its `flops` per second and MFU."""
        tokens = self.epochs * int(trained.tensors[ATTENTION_MASK].sum())
        out = {
            UPDATE_TOKENS_PER_S: tokens / seconds,
            per_device(UPDATE_TOKENS_PER_S): tokens / seconds / self.devices,
        }
        if self.shape is None:
            return out
        out[UPDATE_TFLOPS_PER_DEVICE] = flops / seconds / self.devices / 1e12
        if self.peak is not None:
            out[UPDATE_MFU] = out[UPDATE_TFLOPS_PER_DEVICE] / self.peak.tflops
            out[PEAK_TFLOPS_PER_DEVICE] = self.peak.tflops
        return out

    def facts(self) -> dict[str, Any]:
        """summary.json's `device_peak`: the devices of each kind, the peak MFU divides by and where it came from."""
        devices = {
            "devices": self.devices,
            "rollout_devices": self.rollout_devices or self.devices,
            "step_devices": self.step_devices or self.devices,
        }
        if self.peak is None:
            return devices
        return {
            **devices,
            "device": self.peak.device,
            "tflops": self.peak.tflops,
            "source": self.peak.source,
        }


def response_tokens(trained: Batch) -> int:
    """The trained rows' response tokens: their attention mask over the response positions."""
    mask = trained.tensors[ATTENTION_MASK]
    return int(mask[:, -trained.tensors[RESPONSES].shape[1] :].sum())
