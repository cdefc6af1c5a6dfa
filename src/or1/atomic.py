"""Files a kill never leaves half-written: write beside the target, then rename over it (atomic on POSIX).

Checkpoints' controller state and `latest` pointer, prompt statistics, scored files, the tiny dataset and
prepare-data's outputs are all written this way; a reader sees the old file or the new one, never a torn one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path beside `path` to write to: renamed onto `path` when the block ends, removed on an error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text_atomically(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)
