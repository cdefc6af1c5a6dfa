"""How the tiny world draws its tasks, arithmetic and programs alike: a fixed held-out set, and endless draws
that skip it.

A task family gives `sample(rng, size)` (size: operands or steps) and `key(task)`, the text two equal tasks share.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

Task = TypeVar("Task")


def held_out(
    seed: int,
    sizes: Iterable[int],
    per_size: int,
    sample: Callable[[random.Random, int], Task],
    key: Callable[[Task], str],
) -> list[Task]:
    """`per_size` distinct tasks of each size in turn, all drawn from one generator seeded with `seed`."""
    rng = random.Random(seed)
    tasks: list[Task] = []
    for size in sizes:
        seen: set[str] = set()
        while len(seen) < per_size:
            task = sample(rng, size)
            if key(task) not in seen:
                seen.add(key(task))
                tasks.append(task)
    return tasks


def endless(
    seed: int,
    sizes: Iterable[int],
    skip: set[str],
    sample: Callable[[random.Random, int], Task],
    key: Callable[[Task], str],
) -> Iterator[Task]:
    """Tasks of sizes drawn uniformly from `sizes`, skipping those whose key is in `skip`."""
    rng = random.Random(seed)
    choices = list(sizes)
    while True:
        task = sample(rng, rng.choice(choices))
        if key(task) not in skip:
            yield task
