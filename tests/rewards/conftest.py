"""Shared fixtures for the reward tests: the math pool is process-wide, so stop it once at the end; the code tests
run on each sandbox backend this machine has."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from or1.sandbox.pool import close_pools as close_sandbox_pools
from or1.sandbox.pool import unavailable


@pytest.fixture(scope="session", autouse=True)
def _stop_math_pools() -> Iterator[None]:
    yield
    from or1.rewards.score import close_pools

    close_pools()


@pytest.fixture(scope="module", params=["local", pytest.param("docker", marks=pytest.mark.docker)])
def backend(request: pytest.FixtureRequest) -> Iterator[str]:
    """A sandbox backend (local, docker), skipped with the reason where this machine lacks it; its pools closed
    after the module."""
    reason = unavailable(request.param)
    if reason:
        pytest.skip(reason)
    yield request.param
    close_sandbox_pools()
