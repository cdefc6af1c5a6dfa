"""Do two runs of a stage write the same numbers? Compares two metrics.jsonl files step by step.

For refactors that must not change what training computes: run the same stage twice (same recipe, seed and
machine: the CPU's kernels decide the floats), once before and once after, then

    python scripts/same_metrics.py runs/before/stage1/metrics.jsonl runs/after/stage1/metrics.jsonl

Every key is compared except wall-clock ones (time/*, perf/*, and under the separate placement how far the replicas
had run ahead when a step was taken: async/queue_depth, async/groups_in_flight); the keys must also come in the same
order (async/staleness_* stay compared: a step's staleness is fixed by its step). Exit code 0 when equal, 1 with one
line per difference otherwise.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WALL_CLOCK = ("time/", "perf/", "async/queue_depth", "async/groups_in_flight")


def differences(before: list[dict], after: list[dict]) -> list[str]:
    """One line per step or value that differs (wall-clock keys left out)."""
    if len(before) != len(after):
        return [f"{len(before)} lines against {len(after)}"]
    found = []
    for old, new in zip(before, after, strict=True):
        step = old.get("step")
        keys, new_keys = ([k for k in row if not k.startswith(WALL_CLOCK)] for row in (old, new))
        if keys != new_keys:
            only = sorted(set(keys) ^ set(new_keys))
            found.append(
                f"step {step}: the keys differ ({only})" if only else f"step {step}: keys in another order"
            )
        found += [f"step {step}: {k} {old[k]!r} -> {new[k]!r}" for k in keys if k in new and old[k] != new[k]]
    return found


def read(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__)
        return 2
    before, after = map(read, argv)
    found = differences(before, after)
    for line in found:
        print(line)
    values = sum(len([k for k in r if not k.startswith(WALL_CLOCK)]) for r in before)
    print(
        f"{len(before)} steps, {values} values compared (wall-clock keys left out): {len(found)} differences"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
