"""Reading a spec's sources: local files through the one record reader, hub datasets through `datasets`, and the
synthetic tiny world. Each yields (position, record) pairs so every row stays traceable to where it came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from or1.data.records import BadRecord, iter_records
from or1.errors import UserError
from or1.prepare.spec import SourceSpec


@dataclass(frozen=True)
class Provenance:
    """What the manifest records about one input: where it is and a content hash (a file's) or revision (hub)."""

    name: str
    origin: str
    sha256: str | None = None
    revision: str | None = None


def iter_source(source: SourceSpec) -> Iterator[tuple[int, dict[str, Any] | BadRecord]]:
    """(position, raw record or BadRecord) for every record of `source`, at most `limit` of them."""
    if source.path:
        records = iter_records(source.path, what=f"source {source.name!r}: file")
    elif source.hub:
        records = enumerate(_hub_records(source))
    else:
        records = enumerate(synthetic_rows(source))
    for index, record in records:
        if source.limit is not None and index >= source.limit:
            return
        yield index, record


def provenance(source: SourceSpec) -> Provenance:
    if source.path:
        from or1.data.benchmarks import file_sha256

        path = Path(source.path)
        return Provenance(source.name, str(path.resolve()), sha256=file_sha256(path))
    if source.hub:
        origin = f"hub:{source.hub}" + (f"/{source.config}" if source.config else "") + f":{source.split}"
        return Provenance(source.name, origin, revision=_hub_fingerprint(source))
    return Provenance(source.name, f"synthetic:{source.synthetic} seed={source.seed} size={source.size}")


def _load_hub(source: SourceSpec) -> Any:
    try:
        import datasets
    except ImportError:
        raise UserError("hub sources need the `datasets` package (pip install datasets).") from None
    try:
        return datasets.load_dataset(source.hub, source.config, split=source.split)
    except Exception as err:  # offline and missing, unknown id, no such split: one line either way
        hint = (
            " HF_HUB_OFFLINE is set and it is not in the local cache: download it once online, or give a path."
            if _offline()
            else " Check the id, config and split, or give a local path."
        )
        raise UserError(
            f"source {source.name!r}: cannot load {source.hub} ({type(err).__name__}).{hint}"
        ) from None


def _hub_records(source: SourceSpec) -> Iterator[dict[str, Any]]:
    for record in _load_hub(source):
        yield dict(record)


def _hub_fingerprint(source: SourceSpec) -> str | None:
    try:
        return getattr(_load_hub(source), "_fingerprint", None)
    except UserError:
        return None


def _offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes") or os.environ.get(
        "HF_DATASETS_OFFLINE", ""
    ).lower() in ("1", "true", "yes")


def synthetic_rows(source: SourceSpec) -> list[dict[str, Any]]:
    """The rows of a synthetic tiny split, exactly as `or1.data.synthetic.write_tiny_dataset` writes them."""
    from or1.data.synthetic import (
        RL_OPS,
        code_train_rows,
        code_validation_rows,
        math_train_rows,
        math_validation_rows,
    )

    try:
        if source.synthetic == "tiny-math-train":
            ops = source.ops or RL_OPS
            return math_train_rows(source.seed, source.size or 1500, ops)
        if source.synthetic == "tiny-math-validation":
            return math_validation_rows()
        if source.synthetic == "tiny-code-validation":
            return code_validation_rows()
        return code_train_rows(source.seed, source.size or 1500)
    except ValueError as err:
        raise UserError(f"source {source.name!r}: cannot build {source.synthetic}: {err}.") from None
