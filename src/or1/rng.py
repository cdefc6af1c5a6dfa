"""The random-number state of a process (Python, numpy, torch), saved with every checkpoint by the controller and
by each rank, so a resumed run draws what the uninterrupted one would have."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


class ProcessRNG:
    """This process's Python, numpy and torch (CPU) generators as one checkpointable part."""

    def state_dict(self) -> dict[str, Any]:
        return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
