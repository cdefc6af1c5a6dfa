"""Dispatch modes: how a WorkerGroup call fans arguments out to ranks and gathers results back.

A Worker method marked `@register(Dispatch.DP_COMPUTE)` is called on the controller as `group.method(batch)`; the
group splits the call with `split_call`, runs one call per rank, and merges the per-rank results with `collect`.
Both functions are pure (no Ray), so they are tested on their own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from or1.hybrid.batch import Batch

F = TypeVar("F", bound=Callable[..., Any])

_SPEC_ATTR = "__or1_dispatch__"


class Dispatch(Enum):
    """How one controller call maps to per-rank calls."""

    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; returns the list of per-rank results
    DP_COMPUTE = "dp_compute"  # Batch arguments split across data-parallel ranks; Batch results concatenated


@dataclass(frozen=True)
class MethodSpec:
    """What `register` records on a Worker method."""

    dispatch: Dispatch


def register(dispatch: Dispatch = Dispatch.ONE_TO_ALL) -> Callable[[F], F]:
    """Mark a Worker method as callable through a WorkerGroup with the given dispatch mode."""
    if not isinstance(dispatch, Dispatch):
        raise TypeError(f"register(dispatch=...) takes a Dispatch, got {dispatch!r}")

    def mark(fn: F) -> F:
        setattr(fn, _SPEC_ATTR, MethodSpec(dispatch))
        return fn

    return mark


def method_spec(cls: type, name: str) -> MethodSpec | None:
    """The registered dispatch of `cls.name`, or None when the method exists but is not registered."""
    return getattr(getattr(cls, name), _SPEC_ATTR, None)


@dataclass(frozen=True)
class Call:
    """The arguments of one rank's call."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class Split:
    """Per-rank calls plus what `collect` needs to undo the split."""

    calls: list[Call]
    pad: int = 0  # rows appended to the Batch arguments to make equal shares
    rows: int = 0  # the padded Batch arguments' length


def split_call(dispatch: Dispatch, world_size: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Split:
    """Turn one controller call into `world_size` per-rank calls."""
    if dispatch is Dispatch.ONE_TO_ALL:
        return Split([Call(args, kwargs)] * world_size)
    if dispatch is Dispatch.DP_COMPUTE:
        return _split_dp(world_size, args, kwargs)
    raise ValueError(f"unknown dispatch {dispatch!r}")


def collect(dispatch: Dispatch, results: list[Any], split: Split | None = None) -> Any:
    """Merge per-rank results (in rank order) into what the controller sees. A method may return k rows per row it
    was given (k samples per prompt): the padding rows' k rows each, at the end, are dropped."""
    if dispatch is Dispatch.DP_COMPUTE and results and all(isinstance(r, Batch) for r in results):
        merged = Batch.concat(results)
        if split is None or not split.pad:
            return merged
        if len(merged) % split.rows:
            raise ValueError(f"{len(merged)} result rows for {split.rows} rows given: not k per row")
        return merged.unpad(split.pad * len(merged) // split.rows)
    return list(results)


def balanced_order(lengths: Sequence[int], parts: int, *, sort_shares: bool = True) -> list[int]:
    """An order of rows whose `parts` contiguous equal shares (how DP_COMPUTE splits a Batch) carry about equal
    lengths, each share's rows shortest first (or, without sort_shares, in their original order).

    Rows are dealt longest first in snake order (0, 1, .., p-1, p-1, .., 0, ...), so no rank waits on one that got
    the long sequences; sorted shares make micro-batches of like lengths (less padding), the original order keeps
    a share's mini-batches free of any length bias. Counts stay equal when len(lengths) is a multiple of `parts`.
    """
    by_length = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    shares: list[list[int]] = [[] for _ in range(parts)]
    for k, row in enumerate(by_length):
        turn, lap = k % parts, (k // parts) % 2
        shares[parts - 1 - turn if lap else turn].append(row)
    return [row for share in shares for row in (reversed(share) if sort_shares else sorted(share))]


def _split_dp(world_size: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Split:
    lengths = {len(v) for v in (*args, *kwargs.values()) if isinstance(v, Batch)}
    if not lengths:
        raise TypeError("a DP_COMPUTE method needs at least one Batch argument to split")
    if len(lengths) > 1:
        raise ValueError(f"DP_COMPUTE Batch arguments have different lengths {sorted(lengths)}")
    pad = -next(iter(lengths)) % world_size

    def parts(value: Any) -> list[Any]:
        if not isinstance(value, Batch):
            return [value] * world_size  # non-Batch arguments (temperature, flags) go to every rank unchanged
        padded, _ = value.pad_to_multiple(world_size)
        return padded.chunk(world_size)

    arg_parts = [parts(a) for a in args]
    kwarg_parts = {k: parts(v) for k, v in kwargs.items()}
    calls = [
        Call(tuple(p[r] for p in arg_parts), {k: p[r] for k, p in kwarg_parts.items()})
        for r in range(world_size)
    ]
    return Split(calls, pad, next(iter(lengths)) + pad)
