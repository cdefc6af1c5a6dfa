"""A cgroup per local sandbox slot, capping the memory and process count of the runner and all its tests together.

rlimits bound each process; only a cgroup bounds a fork bomb of memory hogs as a whole. Best effort: used when the
host lets us (root with cgroup v1 memory+pids hierarchies, or v2 with those controllers delegated); otherwise the
local backend runs on rlimits alone. Slot cgroups are children of this process's own cgroups, so whatever limits the
caller's service manager set keep binding the sandbox too; only the sandbox's own launcher shell is ever moved.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from or1.sandbox.protocol import Limits

ROOT = Path("/sys/fs/cgroup")


def own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller ("" for the v2 unified hierarchy), from /proc/self/cgroup."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _v2_dirs(name: str, own: dict[str, str]) -> dict[str, Path] | None:
    if not (ROOT / "cgroup.controllers").exists() or "" not in own:
        return None
    parent = ROOT / own[""].lstrip("/")
    enabled = (parent / "cgroup.subtree_control").read_text().split()
    if not {"memory", "pids"} <= set(enabled):
        return None  # not delegated to us: enabling them here would need our own cgroup to be empty
    return {"memory": parent / name, "pids": parent / name}


def _v1_dirs(name: str, own: dict[str, str]) -> dict[str, Path] | None:
    if not all(c in own for c in ("memory", "pids")):
        return None
    dirs = {c: ROOT / c / own[c].lstrip("/") / name for c in ("memory", "pids")}
    return dirs if all(d.parent.joinpath("cgroup.procs").exists() for d in dirs.values()) else None


class SlotCgroup:
    """The cgroup(s) of one slot; `wrap` makes a command join them before it execs."""

    def __init__(self, dirs: dict[str, Path], v2: bool):
        self.dirs, self.v2 = dirs, v2

    @classmethod
    def create(cls, name: str, limits: Limits) -> SlotCgroup | None:
        """Create and configure the slot's cgroup, or None when cgroups are not available to us."""
        if os.geteuid() != 0 or os.environ.get("OR1_SANDBOX_NO_CGROUP"):
            return None
        try:
            own = own_cgroups()
            v2_dirs = _v2_dirs(name, own)
            dirs = v2_dirs or _v1_dirs(name, own)
            if dirs is None:
                return None
            group = cls(dirs, v2=v2_dirs is not None)
        except OSError:
            return None
        try:
            for d in set(dirs.values()):
                SlotCgroup.remove_stale(d.parent)
                d.mkdir()
            memory = str(limits.slot_memory_mb << 20)
            pids = str(2 * limits.processes + 16)  # candidate + checker + runner and bwrap
            if group.v2:
                (dirs["memory"] / "memory.max").write_text(memory)
                (dirs["memory"] / "memory.swap.max").exists() and (
                    dirs["memory"] / "memory.swap.max"
                ).write_text("0")
                (dirs["pids"] / "pids.max").write_text(pids)
            else:
                (dirs["memory"] / "memory.limit_in_bytes").write_text(memory)
                (dirs["pids"] / "pids.max").write_text(pids)
            return group
        except OSError:
            group.remove()
            return None

    @staticmethod
    def remove_stale(parent: Path) -> None:
        """Remove empty slot cgroups of or1 processes that died without closing their slots."""
        for d in parent.glob("or1-*"):
            pid = d.name.split("-")[1]
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                try:
                    d.rmdir()  # fails, harmlessly, while anything still runs in it
                except OSError:
                    pass

    def procs_files(self) -> list[str]:
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def wrap(self, cmd: list[str]) -> list[str]:
        """Prefix `cmd` with a shell that moves itself into the cgroup(s) and then execs `cmd`."""
        joins = "".join(f'echo $$ > "{p}" && ' for p in self.procs_files())
        return ["/bin/sh", "-c", f'{joins}exec "$@"', "or1-sandbox", *cmd]

    def remove(self) -> None:
        """Remove the (now empty) cgroup directories, waiting briefly for killed processes to be released."""
        for d in set(self.dirs.values()):
            for _ in range(200):
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)
