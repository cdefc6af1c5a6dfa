"""PPO's critic engine: the policy's architecture with a scalar value head (token classification) under FSDP2.

Values of every response token and the clipped value-regression update; sharding, micro-batches, the update loop
and checkpoints are `fsdp.FSDPEngine`'s.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from or1.algos.losses import value_loss
from or1.engines.fsdp import FSDPEngine
from or1.engines.loading import load_value_model
from or1.engines.train_settings import DTYPES, TrainSettings
from or1.hybrid.batch import Batch
from or1.hybrid.columns import RESPONSE_MASK, RETURNS, VALUES

# The token-classification head's output trips FSDP2's warning about in-place ops on view outputs; the critic only
# slices its logits out of place.
warnings.filterwarnings(
    "ignore", message=r"FSDP2-wrapped module \(FSDP\w+ForTokenClassification\) returned a view"
)


class FSDPCriticEngine(FSDPEngine):
    """The critic of PPO with GAE: the policy's architecture with a scalar value head (token classification)."""

    def __init__(self, model_path: str | Path, settings: TrainSettings, *, cliprange_value: float):
        super().__init__(load_value_model(model_path, dtype=DTYPES[settings.dtype]), settings)
        self.cliprange_value = cliprange_value

    def _forward(self, micro: dict[str, torch.Tensor]) -> torch.Tensor:
        """Values [b, R]: V_t is read where the policy's logits for response token t are (the state before it)."""
        window = self._window(micro)
        if self.sp_group is not None:
            outs = self._sequence_parallel_forward(window, lambda logits, _: {VALUES: logits[..., 0].float()})
            return window.scatter(window.picked(outs[VALUES]))
        out = self.model(**window.inputs, use_cache=False)
        return window.scatter(window.picked(out.logits)[..., 0].float())

    def values(self, batch: Batch) -> Batch:
        """The critic's values (key `values`) of every response token, [B, R]."""
        return self._inference(batch, lambda micro: {VALUES: self._forward(micro)})

    def train_step(self, batch: Batch) -> dict[str, float]:
        """One clipped value-regression update towards `returns` (see `FSDPEngine._update`)."""

        def micro_loss(micro: dict[str, torch.Tensor], num_tokens: float, num_seqs: float):
            return value_loss(
                self._forward(micro),
                micro[VALUES],
                micro[RETURNS],
                micro[RESPONSE_MASK],
                cliprange=self.cliprange_value,
                num_tokens=num_tokens,
            )

        return self._update(batch.tensors, micro_loss)
