"""Collection columns as numpy arrays, with the row and field named when they are bad."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Hashable

import numpy as np
import pyarrow as pa

from leakray.errors import BadInput


def _column(table: pa.Table, name: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        raise BadInput(f"collection lacks column {name!r}", field=name)
    col = table.column(name)
    if col.null_count:
        row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInput("null value", row=row, field=name)
    return col


def scalar_column(table: pa.Table, name: str, dtype=np.float64) -> np.ndarray:
    """A scalar column as a 1-D array; refuses nulls and (for floats) non-finite values."""
    arr = _column(table, name).to_numpy().astype(dtype)
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
        raise BadInput("non-finite value", row=int(np.flatnonzero(~np.isfinite(arr))[0]), field=name)
    return arr


def list_column(table: pa.Table, name: str, width: int | None = None, dtype=np.float32) -> np.ndarray:
    """A fixed-length list column as a 2-D array [n, width]; refuses ragged rows, nulls, NaN/inf."""
    col = _column(table, name).combine_chunks()
    if isinstance(col, pa.ChunkedArray):  # empty table
        col = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
    n = len(col)
    lengths = col.value_lengths().to_numpy(zero_copy_only=False) if n else np.zeros(0, int)
    want = width if width is not None else (int(lengths[0]) if n else 0)
    bad = np.flatnonzero(lengths != want)
    if len(bad):
        raise BadInput(f"list has {lengths[bad[0]]} entries, expected {want}", row=int(bad[0]), field=name)
    values = col.flatten()
    if values.null_count:
        pos = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInput("null list entry", row=pos // max(want, 1), field=name)
    out = values.to_numpy(zero_copy_only=False).astype(dtype).reshape(n, want)
    if np.issubdtype(out.dtype, np.floating) and not np.all(np.isfinite(out)):
        raise BadInput("non-finite list entry", row=int(np.flatnonzero(~np.isfinite(out).all(1))[0]), field=name)
    return out


def ragged_column(table: pa.Table, name: str, dtype=np.float64, min_len: int = 1) -> list[np.ndarray]:
    """A variable-length list column (per-token values) as one array per row; refuses
    nulls, rows shorter than ``min_len`` and (for floats) non-finite entries."""
    col = _column(table, name).combine_chunks()
    if isinstance(col, pa.ChunkedArray):
        col = pa.concat_arrays(col.chunks) if col.num_chunks else pa.array([], col.type)
    values = col.flatten()
    offsets = col.offsets.to_numpy() - col.offsets[0].as_py() if len(col) else np.zeros(1, np.int64)
    if values.null_count:
        pos = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise BadInput("null list entry", row=int(np.searchsorted(offsets, pos, side="right") - 1), field=name)
    flat = values.to_numpy(zero_copy_only=False).astype(dtype)
    rows = [flat[offsets[i]:offsets[i + 1]] for i in range(len(col))]
    for i, r in enumerate(rows):
        if len(r) < min_len:
            raise BadInput(f"list has {len(r)} entries, at least {min_len} needed", row=i, field=name)
        if np.issubdtype(r.dtype, np.floating) and not np.all(np.isfinite(r)):
            raise BadInput("non-finite list entry", row=i, field=name)
    return rows


def same_lengths(a: list[np.ndarray], b: list[np.ndarray], name_a: str, name_b: str) -> None:
    """Per-token columns over the same tokens must have equal lengths row by row."""
    for i, (x, y) in enumerate(zip(a, b)):
        if len(x) != len(y):
            raise BadInput(f"{len(x)} tokens in {name_a!r} but {len(y)} in {name_b!r}", row=i, field=name_b)


_PER_TABLE: dict[int, dict[Hashable, Any]] = {}


def per_table(table: pa.Table, key: Hashable, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per table object and ``key``, kept while the table lives. A table is
    immutable, and a detector's inputs are a pure function of it: every seed's fit and score
    read the same two collections, so the composites built their inputs ten times over (five
    seeds, shadow and target) in one process. Arrays in the result are made read-only."""
    memo = _PER_TABLE.get(id(table))
    if memo is None:
        memo = _PER_TABLE[id(table)] = {}
        weakref.finalize(table, _PER_TABLE.pop, id(table), None)  # the id may be reused once it is gone
    if key not in memo:
        value = compute()
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, np.ndarray):
                v.setflags(write=False)
        memo[key] = value
    return memo[key]
