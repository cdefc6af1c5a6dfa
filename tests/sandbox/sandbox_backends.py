"""Which sandbox backends the tests run on: both, the docker one marked `docker`, each skipped when unavailable."""

from __future__ import annotations

import functools

import pytest

from or1.sandbox.pool import unavailable

BACKENDS = ["local", pytest.param("docker", marks=pytest.mark.docker)]


@functools.cache
def _reason(backend: str) -> str | None:
    return unavailable(backend)


def require(backend: str) -> None:
    """Skip the calling test when `backend` cannot run here."""
    reason = _reason(backend)
    if reason:
        pytest.skip(reason)
