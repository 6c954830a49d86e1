"""Exact verification of candidate pairs on the same shingle hashes that were MinHashed."""

from __future__ import annotations

import numpy as np

from leakray.screen.shingle import ShingleSets


def gather(sets: ShingleSets, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated shingles of `rows` and the start of each row's run in the result."""
    rows = np.asarray(rows, dtype=np.int64)
    sizes = sets.sizes[rows]
    starts = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    pos = np.repeat(sets.offsets[rows], sizes) + (np.arange(total) - np.repeat(starts, sizes))
    return sets.values[pos], starts


def intersections(entries: ShingleSets, files: ShingleSets, file_rows: np.ndarray,
                  entry_rows: np.ndarray) -> np.ndarray:
    """|entry ∩ file| for each pair (file_rows[i], entry_rows[i]); one searchsorted per distinct file."""
    file_rows = np.asarray(file_rows, dtype=np.int64)
    entry_rows = np.asarray(entry_rows, dtype=np.int64)
    out = np.zeros(len(file_rows), dtype=np.int64)
    if len(file_rows) == 0:
        return out
    order = np.argsort(file_rows, kind="stable")
    bounds = np.flatnonzero(np.diff(file_rows[order])) + 1
    for grp in np.split(order, bounds):
        f = files[int(file_rows[grp[0]])]
        if len(f) == 0:
            continue
        vals, starts = gather(entries, entry_rows[grp])
        if len(vals) == 0:
            continue
        pos = np.searchsorted(f, vals).clip(max=len(f) - 1)
        hit = (f[pos] == vals).astype(np.int64)
        sizes = entries.sizes[entry_rows[grp]]
        nz = sizes > 0
        counts = np.zeros(len(grp), dtype=np.int64)
        counts[nz] = np.add.reduceat(hit, starts[nz])
        out[grp] = counts
    return out


def jaccard_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted unique arrays (reference, used in tests)."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0
