"""samples.jsonl: every generated sample with its score, appended as it is made, so a killed run resumes.

The first line is a header holding the run's fingerprint (model hash, data hash, sampling settings, seed, engine).
Each following line is one `SampleRecord`, keyed by (problem_id, sample_index). Reopening a file whose fingerprint
differs is a UserError unless the caller starts over (`--overwrite`): samples drawn under other settings must not mix.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from or1.errors import UserError

SAMPLES_FILE = "samples.jsonl"


@dataclass(frozen=True)
class SampleRecord:
    """One scored sample; `answer` is the normalised extracted answer that maj@k votes with."""

    problem_id: str
    sample_index: int
    response: str
    num_tokens: int
    truncated: bool
    score: float
    reason: str
    extracted: str | None
    answer: str | None
    detail: str | None


class SampleCache:
    """Append-only store of scored samples in `path`, checked against `fingerprint` when it already exists."""

    def __init__(self, path: Path, fingerprint: dict[str, Any], *, fresh: bool = False):
        self.path = path
        self.records: dict[tuple[str, int], SampleRecord] = {}
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not fresh:
            self._load(fingerprint)
        else:
            with path.open("w") as handle:
                handle.write(json.dumps({"header": fingerprint}, sort_keys=True) + "\n")
                _sync(handle)

    def _load(self, fingerprint: dict[str, Any]) -> None:
        text = self.path.read_text()
        if not text.endswith("\n"):  # a kill mid-write leaves a partial last line: drop it before appending
            text = text[: text.rfind("\n") + 1]
            self.path.write_text(text)
        lines = text.splitlines()
        if not lines:
            raise UserError(f"{self.path} is empty; delete it or pass --overwrite to start over.")
        header = json.loads(lines[0]).get("header")
        if header != fingerprint:
            changed = sorted(
                k for k in set(header or {}) | set(fingerprint) if (header or {}).get(k) != fingerprint.get(k)
            )
            raise UserError(
                f"{self.path} was generated with different settings ({', '.join(changed)}); "
                "use another --out or pass --overwrite to discard those samples."
            )
        for line in lines[1:]:
            record = SampleRecord(**json.loads(line))
            self.records[(record.problem_id, record.sample_index)] = record

    def has(self, problem_id: str, sample_index: int) -> bool:
        return (problem_id, sample_index) in self.records

    def add(self, records: list[SampleRecord]) -> None:
        """Append `records` and flush them to disk before returning, so a kill right after keeps them."""
        with self.path.open("a") as handle:
            for record in records:
                handle.write(json.dumps(asdict(record)) + "\n")
                self.records[(record.problem_id, record.sample_index)] = record
            _sync(handle)


def _sync(handle: Any) -> None:
    handle.flush()
    os.fsync(handle.fileno())
