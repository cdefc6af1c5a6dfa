"""Sandbox fixtures: warm pools per backend, skipped cleanly when the backend cannot run here."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sandbox_backends import BACKENDS, require

from or1.sandbox.pool import SandboxPool


@pytest.fixture(scope="module", params=BACKENDS)
def pool(request: pytest.FixtureRequest) -> Iterator[SandboxPool]:
    """A warm two-slot pool of each backend, shared by a module's tests."""
    require(request.param)
    pool = SandboxPool(request.param, 2)
    yield pool
    pool.close()
