"""ray_session: the one place or1 starts, joins and stops Ray."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ray

import or1

# src/ of the checkout this or1 was imported from: workers put it on their path to import the same code.
SOURCE_ROOT = Path(or1.__file__).resolve().parent.parent
# Worker processes' console output reaches the driver's: keep model-loading progress bars out of it.
QUIET_WORKER_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def worker_pythonpath(existing: str | None = None) -> str:
    """PYTHONPATH with the source tree first, so workers import the same or1 as the controller."""
    return os.pathsep.join(
        dict.fromkeys([str(SOURCE_ROOT), *filter(None, (existing or "").split(os.pathsep))])
    )


def worker_runtime_env(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The runtime_env of or1 workers in a joined cluster: `extra` with the source tree first on PYTHONPATH."""
    extra = dict(extra or {})
    env_vars = {**QUIET_WORKER_ENV, **extra.pop("env_vars", {})}
    env_vars["PYTHONPATH"] = worker_pythonpath(env_vars.get("PYTHONPATH") or os.environ.get("PYTHONPATH"))
    return {**extra, "env_vars": env_vars}


# Ray's notice, at every ray.init, that token authentication is on (as it should be): one line of noise per command
TOKEN_NOTICE_LOGGER = "ray._private.authentication.authentication_token_setup"


def local_cpus(processes: int) -> int:
    """CPUs a local Ray offers: every core of the machine, and at least one per worker process (rank or replica)."""
    return max(os.cpu_count() or 1, processes)


@contextmanager
def ray_session(
    address: str | None = None,
    *,
    num_cpus: int | None = None,
    num_gpus: int | None = None,
    runtime_env: dict[str, Any] | None = None,
    **init_kwargs: Any,
) -> Iterator[None]:
    """Run the body with Ray connected.

    address None starts a private local Ray (no dashboard, warnings only) and shuts it down on exit, also on an
    exception or Ctrl-C; an address such as "auto" or "ray://host:10001" joins that cluster and leaves it running.
    num_cpus / num_gpus only apply to a local Ray. When Ray is already connected in this process, it is reused.
    """
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage-stats banner or network call
    options: dict[str, Any] = {"logging_level": logging.WARNING, **init_kwargs}
    if address is None:
        # Ray refuses node options when joining, so they are set only here.
        options.update(num_cpus=num_cpus, num_gpus=num_gpus, include_dashboard=False)
        if runtime_env:
            options["runtime_env"] = runtime_env
        with _inherited_worker_env(), _quiet(TOKEN_NOTICE_LOGGER):
            # "local": always a private Ray, never one that another process or `ray start` left on this machine
            ray.init(address="local", **options)
    else:
        with _quiet(TOKEN_NOTICE_LOGGER):
            ray.init(address=address, runtime_env=worker_runtime_env(runtime_env), **options)
    try:
        yield
    finally:
        ray.shutdown()  # stops a local Ray; for a joined cluster it only disconnects this driver


@contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """The named logger says only errors in the body (a name a Ray version lacks: a logger nobody writes to)."""
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


@contextmanager
def _inherited_worker_env() -> Iterator[None]:
    # A local Ray's workers inherit the environment of the raylet ray.init spawns; a job runtime_env instead would
    # make Ray start every actor process through its runtime-env agent, seconds slower each.
    changes = {**QUIET_WORKER_ENV, "PYTHONPATH": worker_pythonpath(os.environ.get("PYTHONPATH"))}
    changes = {k: v for k, v in changes.items() if k == "PYTHONPATH" or k not in os.environ}  # the user's win
    before = {key: os.environ.get(key) for key in changes}
    os.environ.update(changes)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value
