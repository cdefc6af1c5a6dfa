"""A math verifier that hangs on responses containing HANG: imported by name inside the verifier processes, so it
lives in a module of its own with nothing heavy to import."""

from __future__ import annotations

import time

from or1.rewards.math import verify_math


def verify_or_hang(response: str, ground_truth: str, extraction: str = "math_verify"):
    if "HANG" in response:
        time.sleep(3600)
    return verify_math(response, ground_truth, extraction)
