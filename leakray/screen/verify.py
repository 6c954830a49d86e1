"""Exact verification of candidate pairs: shared shingles (the same hashes the filter used) and
an aligned span check that tells a copy from a chance overlap of common shingles."""

from __future__ import annotations

import numpy as np

from leakray.screen.shingle import ShingleSets, fold

_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


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


def window_values(tokens: np.ndarray, r: int) -> np.ndarray:
    """A 64-bit value of every window of r consecutive tokens (len(tokens) - r + 1 values): the
    2-token `fold` values that tile it (and its last token where r is odd), multiply-added, then
    mixed. Equal windows get equal values on both sides of a check; `fold(tokens, r)` would mix
    once per token (r - 1 rounds of fmix64 over the text), this mixes twice."""
    m = len(tokens) - r + 1
    if r <= 2 or m <= 0:
        return fold(tokens, r) if m > 0 else np.empty(0, np.uint64)
    pairs = fold(tokens, 2)
    with np.errstate(over="ignore"):
        v = pairs[:m].copy()
        for i in range(1, r // 2):
            v *= _MIX
            v += pairs[2 * i:2 * i + m]
        if r % 2:
            v *= _MIX
            v += tokens[r - 1:r - 1 + m]
        return fold(v, 1)


class Runs:
    """A corpus text's runs of r consecutive tokens, hashed and sorted, per r (computed once),
    and where each token starts in the text."""

    def __init__(self, token_hashes: np.ndarray, starts: np.ndarray | None = None):
        self.tokens, self.starts = token_hashes, starts
        self._by_len: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def of(self, r: int) -> tuple[np.ndarray, np.ndarray]:
        if r not in self._by_len:
            g = window_values(self.tokens, r)
            order = np.argsort(g, kind="stable")
            self._by_len[r] = (g[order], order)
        return self._by_len[r]


def aligned_span(sample: np.ndarray, text: Runs, span_tokens: int) -> tuple[float, int, int]:
    """(coverage, first, last): the share of the sample's tokens that lie in runs of at least
    `span_tokens` tokens (fewer for a shorter sample) found in the same order in the text, and
    the text's first and last token of the aligned copy (-1, -1 when none).

    A copy covers nearly all of its sample, even with a few edits; shingles shared by chance
    (punctuation, numbers, keywords spread over a large file) are not in long aligned runs.
    """
    r = min(span_tokens, len(sample))
    if r == 0 or len(text.tokens) < r:
        return 0.0, -1, -1
    runs, order = text.of(r)
    grams = window_values(sample, r)
    pos = np.searchsorted(runs, grams).clip(max=len(runs) - 1)
    hit = runs[pos] == grams
    j = np.flatnonzero(hit)
    if len(j) == 0:
        return 0.0, -1, -1
    n = len(sample)
    marks = np.bincount(j, minlength=n + 1) - np.bincount(j + r, minlength=n + r + 1)[:n + 1]
    coverage = float(np.count_nonzero(np.cumsum(marks[:n]) > 0)) / n
    where = order[pos[j]]
    # the copy's place: the windows on the main alignment diagonal (text position - sample
    # position), so boilerplate repeated elsewhere in the text does not stretch the span
    diag = where - j
    values, counts = np.unique(diag, return_counts=True)
    main = values[np.argmax(counts)]
    near = np.abs(diag - main) <= r + n // 10  # a few insertions or deletions in the copy
    return coverage, int(where[near].min()), int(where[near].max()) + r - 1


def jaccard_exact(a: np.ndarray, b: np.ndarray) -> float:
    """Jaccard of two sorted unique arrays (reference, used in tests)."""
    inter = len(np.intersect1d(a, b, assume_unique=True))
    union = len(a) + len(b) - inter
    return inter / union if union else 0.0
