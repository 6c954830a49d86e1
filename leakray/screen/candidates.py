"""Candidate pairs from a sorted key index: every (corpus text, benchmark entry) sharing enough keys.

One sorted uint64 array holds the indexed keys of every entry and `owner` the entry of each
key, so a probe for a whole batch of corpus texts is one ``np.searchsorted``; a bit table on
the low bits of the keys first drops most corpus shingles with one lookup each.
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64


class KeyFilter:
    """A bit table (one byte per slot) answering "maybe indexed" for 48-bit shingle values."""

    def __init__(self, keys: np.ndarray, slots_per_key: int = 32, min_bits: int = 12, max_bits: int = 24):
        bits = int(np.clip(np.ceil(np.log2(max(1, len(keys)) * slots_per_key)), min_bits, max_bits))
        self.mask = _U64((1 << bits) - 1)
        self.table = np.zeros(1 << bits, dtype=bool)
        self.table[(keys & self.mask).astype(np.intp)] = True

    @property
    def nbytes(self) -> int:
        return self.table.nbytes

    def maybe(self, values: np.ndarray) -> np.ndarray:
        """Positions of the values that may be indexed (all indexed ones, a few others)."""
        return np.flatnonzero(self.table.take((values & self.mask).astype(np.intp)))


def expand_matches(sorted_keys: np.ndarray, owner: np.ndarray, query: np.ndarray, query_row: np.ndarray,
                   min_hits: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each query key, every owner of an equal key: distinct (query_row, owner) pairs and how
    many keys matched each; with `min_hits` (per owner) only pairs matched by that many keys."""
    none = np.empty(0, np.int64)
    if len(query) == 0 or len(sorted_keys) == 0:
        return none, none, none
    lo = np.searchsorted(sorted_keys, query, side="left")
    hit = sorted_keys.take(lo, mode="clip") == query
    if not hit.any():
        return none, none, none
    lo, qrow = lo[hit], query_row[hit]
    cnt = np.searchsorted(sorted_keys, query[hit], side="right") - lo
    total = int(cnt.sum())
    # positions lo[i] .. lo[i]+cnt[i]-1 for every hit, without a Python loop
    run_start = np.repeat(np.cumsum(cnt) - cnt, cnt)
    pos = np.repeat(lo, cnt) + (np.arange(total) - run_start)
    rows = np.repeat(qrow, cnt).astype(np.int64)
    ids = owner[pos].astype(np.int64)
    width = int(owner.max()) + 1
    pair, count = np.unique(rows * width + ids, return_counts=True)
    if min_hits is not None:
        keep = count >= min_hits[pair % width]
        pair, count = pair[keep], count[keep]
    return pair // width, pair % width, count
