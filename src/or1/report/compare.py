"""Whether two evaluation results can be compared: the settings that change the numbers, read from summary.json.

An `or1 eval` summary records what sampled (engine, its version, dtype, tensor parallelism), how (protocol and
every sampling setting, the seed and how each sample's seed derives from it) and on what (the benchmark file's and
the model's hashes). `provenance` reads them, also from summaries written before they were all recorded (missing
ones are None); `compare` names each that differs. A difference in a setting that moves the numbers (data,
sampling, engine build) makes the two incomparable; the others (the model, which is what one compares, the seed,
the tensor parallelism) are listed but do not. `or1 report A B` prints the comparison, report.md the provenance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1.errors import UserError
from or1.layout import SUMMARY_FILE

# (key, whether a difference makes two results incomparable), in the order they are printed
SETTINGS: tuple[tuple[str, bool], ...] = (
    ("benchmark", True),
    ("data_sha256", True),
    ("num_problems", True),
    ("protocol", True),
    ("n", True),
    ("temperature", True),
    ("top_p", True),
    ("max_tokens", True),
    ("engine", True),
    ("engine_version", True),
    ("dtype", True),
    ("tensor_parallel_size", False),
    ("seed", False),
    ("seeding", False),
    ("model_sha256", False),
)


def provenance(summary: dict[str, Any]) -> dict[str, Any]:
    """The settings of SETTINGS from an or1 eval summary.json; None where the summary does not record one."""
    build = summary.get("engine_build") or {}
    sampling = summary.get("sampling") or {}
    data = summary.get("data") or {}
    return {
        "benchmark": summary.get("benchmark"),
        "data_sha256": data.get("sha256") or data.get("source"),
        "num_problems": data.get("num_problems"),
        "protocol": sampling.get("protocol"),
        **{k: sampling.get(k) for k in ("n", "temperature", "top_p", "max_tokens")},
        "engine": build.get("name") or summary.get("engine"),
        "engine_version": build.get("version") or _old_engine_version(summary),
        "dtype": build.get("dtype"),
        "tensor_parallel_size": build.get("tensor_parallel_size"),
        "seed": summary.get("seed"),
        "seeding": summary.get("seeding"),
        "model_sha256": (summary.get("model") or {}).get("sha256"),
    }


def _old_engine_version(summary: dict[str, Any]) -> str | None:
    """A summary from before engine_build: its engine's library version from the environment it recorded."""
    env = summary.get("environment") or {}
    library = "vllm" if summary.get("engine") == "vllm" else "transformers"
    return f"{library} {env[library]}, torch {env.get('torch')}" if env.get(library) else None


@dataclass(frozen=True)
class Difference:
    key: str
    a: Any
    b: Any
    blocks: bool  # True: the two results cannot be compared


@dataclass(frozen=True)
class Comparison:
    differences: list[Difference]

    @property
    def comparable(self) -> bool:
        return not any(d.blocks for d in self.differences)

    def describe(self) -> str:
        """One line: comparable or not, and each difference (`key: a vs b`)."""
        blocking = [d for d in self.differences if d.blocks]
        noted = [d for d in self.differences if not d.blocks]
        parts = []
        if blocking:
            parts.append("INCOMPARABLE, they differ in " + "; ".join(_fmt(d) for d in blocking))
        else:
            parts.append("comparable: same data, protocol, sampling and engine build")
        if noted:
            parts.append("also different: " + "; ".join(_fmt(d) for d in noted))
        return ". ".join(parts)


def compare(a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    """Every setting of SETTINGS on which summaries `a` and `b` differ."""
    pa, pb = provenance(a), provenance(b)
    return Comparison([Difference(k, pa[k], pb[k], blocks) for k, blocks in SETTINGS if pa[k] != pb[k]])


def read_summary(path: Path) -> dict[str, Any]:
    """An or1 eval summary.json, given the file or its output folder."""
    path = Path(path)
    file = path / SUMMARY_FILE if path.is_dir() else path
    if not file.is_file():
        raise UserError(f"{path} holds no {SUMMARY_FILE}; give an or1 eval output folder or its summary.json")
    summary = json.loads(file.read_text())
    if not isinstance(summary, dict) or "sampling" not in summary:
        raise UserError(f"{file} is not the summary of an or1 eval run (no sampling settings)")
    return summary


def compare_lines(first: Path, second: Path) -> tuple[bool, list[str]]:
    """`or1 report A B`: whether the two evaluations compare, and the lines to print (verdict, then estimates)."""
    a, b = read_summary(first), read_summary(second)
    comparison = compare(a, b)
    lines = [comparison.describe()]
    ea = (a.get("metrics") or {}).get("estimates") or {}
    eb = (b.get("metrics") or {}).get("estimates") or {}
    for name in [k for k in ea if k in eb]:
        x, y = ea[name], eb[name]
        lines.append(
            f"{name}: {100 * x['value']:.1f} [{100 * x['ci_low']:.1f}, {100 * x['ci_high']:.1f}] vs "
            f"{100 * y['value']:.1f} [{100 * y['ci_low']:.1f}, {100 * y['ci_high']:.1f}]"
        )
    return comparison.comparable, lines


def _fmt(d: Difference) -> str:
    return f"{d.key}: {_short(d.a)} vs {_short(d.b)}"


def _short(value: Any) -> str:
    text = "not recorded" if value is None else str(value)
    return text[:12] if len(text) == 64 and all(c in "0123456789abcdef" for c in text) else text
