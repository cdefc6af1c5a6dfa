"""The Batch protocol: the one data type that crosses the controller / worker boundary.

A Batch is a set of named columns with a shared first (row) dimension: torch tensors in `tensors`, numpy arrays
(usually object arrays of strings or dicts) in `non_tensor`, plus free-form `meta` that applies to the whole batch
(temperature, step, metrics). Every operation returns a new Batch; column data is never mutated in place.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

Index = slice | Sequence[int] | Sequence[bool] | np.ndarray | torch.Tensor


@dataclass(eq=False)
class Batch:
    """Columns with a shared row dimension plus batch-level meta.

    `len(batch)` is the row count; a batch with no columns (meta only) has length 0 and unions with any batch.
    """

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.tensors = dict(self.tensors)
        self.non_tensor = {k: _as_column_array(k, v) for k, v in self.non_tensor.items()}
        self.meta = dict(self.meta)
        both = set(self.tensors) & set(self.non_tensor)
        if both:
            raise ValueError(f"Batch keys {sorted(both)} are both tensor and non-tensor columns")
        lengths: dict[str, int] = {}
        for key, t in self.tensors.items():
            if not isinstance(t, torch.Tensor) or t.dim() == 0:
                raise ValueError(f"Batch tensor {key!r} must be a torch.Tensor with a row dimension")
            lengths[key] = t.shape[0]
        for key, a in self.non_tensor.items():
            lengths[key] = a.shape[0]
        if len(set(lengths.values())) > 1:
            raise ValueError(f"Batch columns have different row counts: {lengths}")

    # -- construction ---------------------------------------------------------------------------------------------
    @staticmethod
    def from_dict(columns: Mapping[str, Any], meta: Mapping[str, Any] | None = None) -> Batch:
        """Sort columns by type: torch tensors become tensor columns, everything else (lists, arrays) non-tensor."""
        tensors = {k: v for k, v in columns.items() if isinstance(v, torch.Tensor)}
        non_tensor = {k: v for k, v in columns.items() if not isinstance(v, torch.Tensor)}
        return Batch(tensors, non_tensor, dict(meta or {}))

    @staticmethod
    def from_rows(rows: Sequence[Mapping[str, Any]], meta: Mapping[str, Any] | None = None) -> Batch:
        """Build a batch from per-row dicts (same keys): tensor values are stacked, others go to object arrays."""
        if not rows:
            return Batch(meta=dict(meta or {}))
        keys = list(rows[0])
        for i, row in enumerate(rows):
            if list(row) != keys:
                raise ValueError(f"row {i} has keys {sorted(row)}, row 0 has {sorted(keys)}")
        columns: dict[str, Any] = {}
        for key in keys:
            values = [row[key] for row in rows]
            columns[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else values
        return Batch.from_dict(columns, meta)

    # -- access ---------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        for t in self.tensors.values():
            return int(t.shape[0])
        for a in self.non_tensor.values():
            return int(a.shape[0])
        return 0

    @property
    def has_columns(self) -> bool:
        return bool(self.tensors or self.non_tensor)

    def __getitem__(self, key: str) -> torch.Tensor | np.ndarray:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.non_tensor:
            return self.non_tensor[key]
        raise KeyError(f"Batch has no column {key!r}; columns: {sorted(self.keys())}")

    def __contains__(self, key: object) -> bool:
        return key in self.tensors or key in self.non_tensor

    def keys(self) -> list[str]:
        """Column names, tensors first."""
        return [*self.tensors, *self.non_tensor]

    def __repr__(self) -> str:
        cols = [
            f"{k}:{tuple(t.shape)}:{str(t.dtype).removeprefix('torch.')}" for k, t in self.tensors.items()
        ]
        cols += [f"{k}:{a.dtype}" for k, a in self.non_tensor.items()]
        return f"Batch(len={len(self)}, columns=[{', '.join(cols)}], meta={sorted(self.meta)})"

    # -- row operations -------------------------------------------------------------------------------------------
    def select(self, idx: Index) -> Batch:
        """Rows picked by an index list / array / tensor, a slice, or a boolean mask of length len(self)."""
        if isinstance(idx, slice):
            return self._map(lambda t: t[idx], lambda a: a[idx])
        rows = _row_indices(idx, len(self))
        return self._map(lambda t: t[torch.as_tensor(rows, device=t.device)], lambda a: a[rows])

    def chunk(self, n: int) -> list[Batch]:
        """n equal contiguous parts; len(self) must be divisible by n (pad_to_multiple first if it is not)."""
        if n < 1:
            raise ValueError(f"Batch.chunk needs n >= 1, got {n}")
        if len(self) % n:
            raise ValueError(
                f"cannot chunk a Batch of {len(self)} rows into {n} equal parts; pad_to_multiple({n}) first"
            )
        size = len(self) // n
        return [self.select(slice(i * size, (i + 1) * size)) for i in range(n)]

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Rows of all parts in order; parts must have the same columns, and their meta is merged."""
        if not parts:
            raise ValueError("Batch.concat needs at least one part")
        first = parts[0]
        for i, part in enumerate(parts[1:], start=1):
            if set(part.tensors) != set(first.tensors) or set(part.non_tensor) != set(first.non_tensor):
                raise ValueError(
                    f"Batch.concat: part {i} has columns {sorted(part.keys())}, part 0 has {sorted(first.keys())}"
                )
        meta: dict[str, Any] = {}
        for part in parts:
            _merge_into(meta, part.meta, "meta")
        tensors = {k: torch.cat([p.tensors[k] for p in parts]) for k in first.tensors}
        non_tensor = {k: np.concatenate([p.non_tensor[k] for p in parts]) for k in first.non_tensor}
        return Batch(tensors, non_tensor, meta)

    def union(self, other: Batch) -> Batch:
        """Columns and meta of both; shared keys must hold identical values (a conflict is an error)."""
        if self.has_columns and other.has_columns and len(self) != len(other):
            raise ValueError(f"Batch.union of batches with {len(self)} and {len(other)} rows")
        tensors, non_tensor, meta = dict(self.tensors), dict(self.non_tensor), dict(self.meta)
        _merge_into(tensors, other.tensors, "tensor column")
        _merge_into(non_tensor, other.non_tensor, "non-tensor column")
        _merge_into(meta, other.meta, "meta")
        return Batch(tensors, non_tensor, meta)

    def repeat(self, n: int, interleave: bool = True) -> Batch:
        """Each row n times: consecutively when interleave (rows of one prompt form a group), else the whole batch n times."""
        if n < 1:
            raise ValueError(f"Batch.repeat needs n >= 1, got {n}")
        if interleave:
            return self._map(lambda t: t.repeat_interleave(n, dim=0), lambda a: np.repeat(a, n, axis=0))
        return self._map(
            lambda t: t.repeat(n, *([1] * (t.dim() - 1))), lambda a: np.tile(a, (n,) + (1,) * (a.ndim - 1))
        )

    def pad_to_multiple(self, k: int) -> tuple[Batch, int]:
        """Append copies of the leading rows until len is a multiple of k; returns (padded, pad count) for unpad."""
        if k < 1:
            raise ValueError(f"Batch.pad_to_multiple needs k >= 1, got {k}")
        pad = -len(self) % k
        if pad == 0:
            return self, 0
        rows = np.concatenate([np.arange(len(self)), np.arange(pad) % len(self)])
        return self.select(rows), pad

    def unpad(self, pad: int) -> Batch:
        """Drop the last `pad` rows (the ones pad_to_multiple added)."""
        if not 0 <= pad <= len(self):
            raise ValueError(f"cannot unpad {pad} rows from a Batch of {len(self)}")
        return self if pad == 0 else self.select(slice(0, len(self) - pad))

    # -- columns --------------------------------------------------------------------------------------------------
    def only(self, keys: Iterable[str]) -> Batch:
        """A batch with just these columns (and all meta): send workers only what they read."""
        keys = list(keys)
        missing = [k for k in keys if k not in self]
        if missing:
            raise KeyError(f"Batch has no columns {missing}; columns: {sorted(self.keys())}")
        return Batch(
            {k: v for k, v in self.tensors.items() if k in keys},
            {k: v for k, v in self.non_tensor.items() if k in keys},
            self.meta,
        )

    def drop(self, keys: Iterable[str]) -> Batch:
        """A batch without these columns (unknown keys are ignored)."""
        keys = set(keys)
        return self.only([k for k in self.keys() if k not in keys])

    def to(self, device: torch.device | str) -> Batch:
        """Tensor columns moved to `device`; non-tensor columns and meta unchanged."""
        return self._map(lambda t: t.to(device), lambda a: a)

    # -- pickling -------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # Slices share their parent's storage and torch pickles whole storages: copy so a chunk ships only its rows.
        return {
            "tensors": {k: _compact_tensor(t) for k, t in self.tensors.items()},
            "non_tensor": {k: np.ascontiguousarray(a) for k, a in self.non_tensor.items()},
            "meta": self.meta,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.tensors, self.non_tensor, self.meta = state["tensors"], state["non_tensor"], state["meta"]

    def _map(self, on_tensor: Any, on_array: Any) -> Batch:
        return Batch(
            {k: on_tensor(t) for k, t in self.tensors.items()},
            {k: on_array(a) for k, a in self.non_tensor.items()},
            self.meta,
        )


def _as_column_array(key: str, value: Any) -> np.ndarray:
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            raise ValueError(f"Batch non-tensor column {key!r} must have a row dimension")
        return value
    if isinstance(value, torch.Tensor):
        raise ValueError(f"Batch column {key!r} is a tensor; put it in `tensors`")
    values = list(value)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):  # element-wise so lists of equal-length lists stay one object per row
        out[i] = v
    return out


def _row_indices(idx: Index, n: int) -> np.ndarray:
    if isinstance(idx, int | np.integer):
        raise TypeError(
            "Batch.select takes an index list / array, slice or bool mask; use select([i]) for one row"
        )
    rows = idx.detach().cpu().numpy() if isinstance(idx, torch.Tensor) else np.asarray(idx)
    if rows.dtype == bool:
        if rows.shape != (n,):
            raise ValueError(f"Batch.select mask has shape {rows.shape}, the batch has {n} rows")
        return np.flatnonzero(rows)
    if rows.size == 0:
        return np.zeros(0, dtype=np.int64)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise TypeError(
            f"Batch.select needs a 1-d integer index or bool mask, got dtype {rows.dtype} shape {rows.shape}"
        )
    if rows.min() < -n or rows.max() >= n:
        raise IndexError(f"Batch.select index out of range for a batch of {n} rows")
    return rows.astype(np.int64)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a.cpu(), b.cpu())
        )
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        return all(_same(x, y) for x, y in zip(a.ravel().tolist(), b.ravel().tolist(), strict=True))
    try:
        return bool(a == b)
    except (ValueError, TypeError, RuntimeError):  # containers of arrays have no single truth value
        return False


def _merge_into(target: dict[str, Any], source: Mapping[str, Any], what: str) -> None:
    for key, value in source.items():
        if key in target and not _same(target[key], value):
            raise ValueError(f"Batch {what} {key!r} differs between the batches being combined")
        target.setdefault(key, value)


def _compact_tensor(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().cpu()  # the receiver (often the GPU-less controller) moves it to its own device
    if t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone(memory_format=torch.contiguous_format)
