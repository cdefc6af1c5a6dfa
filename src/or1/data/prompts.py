"""The training prompts of data.train_files: read, chat-templated into ids, the ones longer than
data.max_prompt_length dropped and counted. Fewer usable prompts than a batch is a UserError.

The prompt loader (`or1.trainer.prompt_loader`) trains on `encode_prompts`; `or1 train` calls `check_prompts` before
Ray starts, so data a step cannot be drawn from is refused in seconds, not after the workers' start-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from or1.data.records import file_kind, iter_records, prompt_key
from or1.data.rows import read_rows
from or1.errors import UserError
from or1.tokens import prompt_ids

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

Encoded = list[tuple[dict[str, Any], list[int]]]  # (row, its prompt ids)


def count_rows(path: str | Path) -> int:
    """The rows of a data file, cheaply: a parquet file's metadata, else its records counted."""
    if file_kind(Path(path)) == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows
        except Exception as err:  # pyarrow raises several types for a file that is not parquet
            raise UserError(f"Cannot read {path} as parquet ({type(err).__name__}).") from None
    return sum(1 for _ in iter_records(path))


def check_row_count(files: Sequence[str | Path], batch_size: int) -> None:
    """Every training file holds rows, and all of them together at least one batch."""
    counts = {str(f): count_rows(f) for f in files}
    empty = [f for f, n in counts.items() if n == 0]
    if empty or sum(counts.values()) < batch_size:
        where = (
            f"0 rows in {', '.join(empty)}"
            if empty
            else f"{sum(counts.values())} rows in {', '.join(counts)}"
        )
        raise UserError(
            f"data.train_files: {where}; trainer.batch_size is {batch_size}, so a step cannot be drawn: write the "
            "data again (or1 prepare-data reports what it dropped) or fix data.train_files"
        )


def encode_prompts(
    files: Sequence[str | Path],
    tokenizer: PreTrainedTokenizerBase,
    *,
    batch_size: int,
    max_prompt_length: int,
    keep_keys: set[str] | None = None,
) -> tuple[Encoded, int]:
    """(the usable rows with their prompt ids, how many were longer than max_prompt_length); `keep_keys` (the
    online filter between stages) keeps only those prompts. Fewer usable prompts than `batch_size`: a UserError."""
    rows = [row for f in files for row in read_rows(f)]
    if keep_keys is not None:
        rows = [r for r in rows if prompt_key(r) in keep_keys]
    encoded = [(row, prompt_ids(tokenizer, row["prompt"])) for row in rows]
    usable = [(row, ids) for row, ids in encoded if len(ids) <= max_prompt_length]
    too_long = len(encoded) - len(usable)
    if len(usable) < batch_size:
        raise UserError(
            f"only {len(usable)} usable prompts in {', '.join(map(str, files))} ({too_long} longer than "
            f"data.max_prompt_length={max_prompt_length}); trainer.batch_size is {batch_size}"
        )
    return usable, too_long


def check_prompts(
    files: Sequence[str | Path], batch_size: int, max_prompt_length: int, tokenizer_path: str | None
) -> None:
    """What `or1 train` checks before Ray: enough rows, and with `tokenizer_path` (a local model folder; None when
    the model is not at hand yet) enough prompts within max_prompt_length."""
    check_row_count(files, batch_size)
    if tokenizer_path is not None:
        from or1.tokens import load_tokenizer

        encode_prompts(
            files, load_tokenizer(tokenizer_path), batch_size=batch_size, max_prompt_length=max_prompt_length
        )
