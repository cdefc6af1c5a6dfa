"""Shared fixtures for the reward tests: the math pool is process-wide, so stop it once at the end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _stop_math_pools() -> Iterator[None]:
    yield
    from or1.rewards.score import close_pools

    close_pools()
