"""Gloo ranks spawned by the engine tests, each ended with os._exit once its work is done.

FSDP2 keeps references to its process group past `dist.destroy_process_group()` (torch 2.13 on CPU: the group's
gloo threads are still running), and in about one run of fifteen the interpreter's teardown then aborts the rank
("terminate called without an active exception", SIGABRT) after it has written its results. The ranks of or1
itself are Ray actors, which Ray ends without that teardown; here a rank ends the same way.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


def spawn_ranks(fn: Callable[..., None], *args: Any, nprocs: int = 2) -> None:
    """Run `fn(rank, *args)` in `nprocs` fresh processes and wait for all; a rank's exception is raised here."""
    mp.spawn(_rank, args=(fn, args), nprocs=nprocs, join=True)


def _rank(rank: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    fn(rank, *args)  # an exception goes to mp.spawn, which reports it to the parent
    if dist.is_initialized():
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
